"""The process group of one generation as the framework-neutral modules see it: where and as
whom to meet (:class:`GroupSpec`) and how meeting fails (:class:`RendezvousFailed`).
:mod:`hotswap.train.torch.distributed` forms the group with torch.distributed."""

from __future__ import annotations

import dataclasses
import errno
import ipaddress
import socket


class RendezvousFailed(Exception):
    """The members of a generation did not all arrive (or the wait was interrupted)."""


@dataclasses.dataclass(frozen=True)
class GroupSpec:
    generation: int
    rank: int
    world_size: int
    master_addr: str
    master_port: int


def first_line(error: BaseException) -> str:
    """An error in one line, for warnings (gloo's messages run to many lines)."""
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def timed_out(error: BaseException) -> bool:
    """Whether a failed collective or rendezvous gave up waiting (a peer that hangs, or one
    that left without closing its connections), rather than seeing the peer go (gloo's
    "Connection closed by peer")."""
    text = str(error).lower()
    return any(word in text for word in ("timed out", "timeout", "deadline_exceeded", "deadline exceeded"))


def listen_host(master_addr: str) -> str:
    """The address rank 0 listens on for its generation, whose members reach it at
    MASTER_ADDR: that address itself when it is one of this host's (127.0.0.1 on a local
    cluster: nothing outside this machine can connect). Otherwise (a service address in front
    of rank 0) every interface of this network namespace, said in one line: on Kubernetes a
    pod's own, which is the pod network (the peers are other pods) and the pod's loopback.
    socket.gaierror while the name does not resolve (a pod's DNS name is published as it starts)."""
    family, _, _, _, where = socket.getaddrinfo(master_addr, 0, type=socket.SOCK_STREAM)[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((where[0], 0))
        except OSError as error:
            if error.errno != errno.EADDRNOTAVAIL:
                raise
            print(f"hotswap: {master_addr} is not an address of this host; the rendezvous listens on every interface", flush=True)
            return "::" if family == socket.AF_INET6 else "0.0.0.0"
    return str(where[0])


def on_loopback(master_addr: str) -> bool:
    """Whether every address MASTER_ADDR resolves to is loopback: all ranks run on this
    machine (a local cluster), so every socket of the group can stay on the loopback interface."""
    try:
        return all(
            ipaddress.ip_address(info[4][0]).is_loopback
            for info in socket.getaddrinfo(master_addr, None, type=socket.SOCK_STREAM)
        )
    except (OSError, ValueError):
        return False
