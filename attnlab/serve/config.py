"""The server's settings (``attnlab serve``'s flags), checked when made, and the engine they configure."""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from attnlab.engine.engine import EngineConfig
from attnlab.errors import ConfigError


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass
class ServeConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    max_batch: int = 32
    max_queue: int = 256
    kv_blocks: int | None = None  # None: the engine's rule (EngineConfig.kv_blocks)
    block_size: int = 16
    prefill_chunk: int | None = 256  # prompt tokens a prompt feeds per step; None: a whole prompt in one step
    prefill_budget: int | None = None  # prompt tokens per step across prompts; None: no cap
    api_key: str | None = None
    allow_origins: tuple[str, ...] = ()  # browser origins besides the server's own that may call it
    insecure: bool = False  # bind a non-loopback address without an API key anyway
    request_timeout_s: float = 600.0  # a request still running after this long is ended (408)
    max_tokens_cap: int = 4096
    max_body_bytes: int = 1 << 20
    drain_s: float = 30.0
    model_name: str | None = None
    calibrate: bool = True  # measure the machine for the cost model at start-up (a few seconds, cached on disk)

    def __post_init__(self) -> None:
        for name in ("max_batch", "max_queue", "block_size", "max_tokens_cap", "max_body_bytes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} {getattr(self, name)} must be >= 1")
        if self.kv_blocks is not None and self.kv_blocks < 2:
            raise ConfigError(f"--kv-blocks {self.kv_blocks} must be >= 2")
        if self.prefill_chunk is not None and self.prefill_chunk < 1:
            raise ConfigError(f"--prefill-chunk {self.prefill_chunk} must be >= 1 (0 on the command line: whole prompts)")
        if self.prefill_budget is not None and self.prefill_budget < 1:
            raise ConfigError(f"--prefill-budget {self.prefill_budget} must be >= 1 (omit it for no cap)")
        if not 0 <= self.port < 65536:
            raise ConfigError(f"--port {self.port} must be in 0..65535")
        if self.drain_s < 0:
            raise ConfigError(f"--drain-s {self.drain_s} must be >= 0")
        if not self.request_timeout_s > 0:
            raise ConfigError(f"--request-timeout {self.request_timeout_s} must be > 0 seconds")
        if self.api_key is not None and not self.api_key.strip():
            raise ConfigError("the API key is empty; give a key, or none for an open loopback server")
        if not is_loopback(self.host) and self.api_key is None and not self.insecure:
            raise ConfigError(f"--host {self.host} is reachable from other machines, and no API key is set: anyone "
                              "who can reach it could run the model. Give --api-key-file FILE (or ATTNLAB_API_KEY), "
                              "or pass --insecure to serve without a key anyway")
        bad = [o for o in self.allow_origins if not o.startswith(("http://", "https://")) or o.endswith("/")]
        if bad:
            raise ConfigError(f"--allow-origin {bad[0]!r} must be an origin such as http://localhost:3000 "
                              "(scheme and host, no path or trailing slash)")

    def engine_config(self, cache_dtype=None) -> EngineConfig:
        """The engine the server runs: its batch, KV pool and prefill settings; a fault ends requests, not the
        server (``raise_faults=False``)."""
        return EngineConfig(max_batch=self.max_batch, kv_blocks=self.kv_blocks, block_size=self.block_size,
                            prefill_chunk=self.prefill_chunk, prefill_budget=self.prefill_budget,
                            cache_dtype=cache_dtype, raise_faults=False)
