"""The server's settings, checked when made, and the engine they configure. ``attnlab serve``'s flags are generated
from the fields that carry a ``help`` (cli_args.add_config_flags), so each default lives here alone."""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from attnlab.errors import ConfigError

if TYPE_CHECKING:
    from attnlab.engine.engine import EngineConfig


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass
class ServeConfig:
    host: str = field(default="127.0.0.1", metadata={"help": "address to bind (default: loopback only)"})
    port: int = field(default=8000, metadata={"help": "port to listen on"})
    max_batch: int = field(default=32, metadata={"help": "sequences decoded together at most"})
    max_queue: int = field(default=256, metadata={"help": "requests waiting for a slot; past it: 429"})
    kv_blocks: int | None = field(default=None, metadata={
        "help": "KV-cache blocks of --block-size tokens (default: max-batch full contexts)"})
    block_size: int = field(default=16, metadata={"help": "tokens per KV-cache block (the prefix cache shares whole "
                                                          "blocks)"})
    prefill_chunk: int | None = field(default=256, metadata={
        "help": "prompt tokens a prompt feeds per step, so a long prompt does not stall the running streams "
                "(0: whole prompts)"})
    prefill_budget: int | None = field(default=None, metadata={
        "help": "prompt tokens per step across all prompts, so a burst of new prompts does not stall them either "
                "(default: no cap; costs throughput)"})
    api_key: str | None = None  # from --api-key-file, ATTNLAB_API_KEY or --api-key (cli._api_key)
    allow_origins: tuple[str, ...] = ()  # browser origins besides the server's own that may call it (--allow-origin)
    insecure: bool = field(default=False, metadata={"help": "allow binding a non-loopback --host without an API key"})
    request_timeout_s: float = field(default=600.0, metadata={
        "flag": "--request-timeout", "help": "seconds a request may run before it is ended with 408"})
    max_tokens_cap: int = field(default=4096, metadata={"help": "largest max_tokens a request may ask for"})
    max_body_bytes: int = 1 << 20
    drain_s: float = field(default=30.0, metadata={"help": "on SIGTERM, seconds running requests may finish"})
    model_name: str | None = field(default=None, metadata={
        "help": "the model's name in the API (default: the folder's name)"})
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
        server (``raise_faults=False``). Imported here so that the CLI can build its flags from this class without
        loading the engine."""
        from attnlab.engine.engine import EngineConfig

        return EngineConfig(max_batch=self.max_batch, kv_blocks=self.kv_blocks, block_size=self.block_size,
                            prefill_chunk=self.prefill_chunk, prefill_budget=self.prefill_budget,
                            cache_dtype=cache_dtype, raise_faults=False)
