"""hotswap.train.torch: the PyTorch half of the training SDK (users import :mod:`hotswap.train`).

The run (:mod:`~hotswap.train.torch.run`), the process group
(:mod:`~hotswap.train.torch.distributed`), the state between ranks and disk
(:mod:`~hotswap.train.torch.sync`, :mod:`~hotswap.train.torch.state`,
:mod:`~hotswap.train.torch.snapshot`), checkpoints (:mod:`~hotswap.train.torch.checkpointer`,
:mod:`~hotswap.train.torch.store`, :mod:`~hotswap.train.torch.tensorfiles`,
:mod:`~hotswap.train.torch.codec`, :mod:`~hotswap.train.torch.staging`) and seed 004's
migrator (:mod:`~hotswap.train.torch.migration`). The framework-neutral pieces they build on
are in :mod:`hotswap.train`; JAX's counterpart is :mod:`hotswap.train.jax`.

This file imports nothing, so that ``import hotswap.train.torch.store`` (which knows files,
not tensors) works without PyTorch. Inside this package ``import torch`` is PyTorch itself
(imports are absolute).
"""
