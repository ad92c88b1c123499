"""hotswap: keep important ML training jobs running through failures and contention."""

__version__ = "0.1.0"
