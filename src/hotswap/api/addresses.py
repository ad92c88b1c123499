"""Network addresses as the user gives them: what counts as this machine's loopback (the one
test for both the dashboard's and the controller's metrics address, and the dashboard's Host
check)."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a parsed address's host, or a Host header's name) is this machine's
    loopback only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
