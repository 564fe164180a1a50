"""Disaggregated prefill / decode for our Dynamo worker: the prompt's KV moves from the prefill worker to the
decode worker through NIXL, by Dynamo's own ``dynamo.nixl_connect`` (CPU tensors, UCX over loopback).

Dynamo's part (ai-dynamo 1.6.1, ``dynamo/common/backend/disagg.py`` and README "Disaggregated Serving"): a
worker started with ``--disaggregation-mode prefill`` registers as a prefill worker; the frontend's
PrefillRouter sends it each request with ``max_tokens`` 1, takes the opaque ``disaggregated_params`` of its
last chunk and hands them to a decode worker as ``request["prefill_result"]``. Moving the KV is the
engine's part, done here:

- prefill: when the request finishes, the engine thread copies the prompt's full blocks
  (``engine.kv_transfer.export_prefix``); the copy is offered as a NIXL *readable* and
  ``disaggregated_params["tritonllm_kv"]`` carries its NIXL metadata, the blocks' chained hashes (hex) and
  the tensor's shape and dtype. The copy stays registered until the decode worker has read it, or for
  ``hold_s`` at most.
- decode: the worker reads the tensor with NIXL, installs it into its own prefix cache on the engine thread
  (``import_prefix``), then admits the request as usual: the prefix match takes the imported blocks and
  only the prompt's last block is computed.

A handoff that fails (prefill worker gone, layout mismatch, timeout) costs compute, not correctness: the
decode worker computes what did not arrive. Nothing here listens beyond loopback when UCX_TLS /
UCX_NET_DEVICES are LOOPBACK_UCX (``launch.py`` sets them).
"""
from __future__ import annotations

import asyncio
import logging
import time

import torch

from ..engine.kv_transfer import KVPrefix

log = logging.getLogger(__name__)
# UCX transports for one machine: TCP on lo for control messages (NIXL's UCX backend needs a transport with
# peer-failure handling), CMA (process_vm_readv) for the zero-copy read.
LOOPBACK_UCX = {"UCX_TLS": "tcp,cma,self", "UCX_NET_DEVICES": "lo"}
KEY = "tritonllm_kv"


class KVHandoff:
    """One per worker: the NIXL connector and the counters its summary log line reports."""

    def __init__(self, hold_s: float = 60.0, read_timeout_s: float = 30.0) -> None:
        self.hold_s, self.read_timeout_s = hold_s, read_timeout_s
        self.connector = None
        self.offered = self.imported_blocks = self.fetched = self.failed = 0
        self._held: set[asyncio.Task] = set()
        self._reporter: asyncio.Task | None = None

    async def start(self) -> None:
        import dynamo.nixl_connect as nc

        self.connector = nc.Connector()
        warm = await self.connector.create_readable(nc.Descriptor(torch.zeros(1)))  # creates the NIXL agent now
        del warm
        self._reporter = asyncio.create_task(self._report())

    def stop(self) -> None:
        if self._reporter is not None:
            self._reporter.cancel()

    async def _report(self, every_s: float = 1.0) -> None:
        """Logs the counters (`summary`) whenever they changed, at most once per `every_s`."""
        said = ""
        while True:
            summary = self.summary()
            if summary != said:
                log.info("%s", summary)
                said = summary
            await asyncio.sleep(every_s)

    # ---- prefill side --------------------------------------------------------------------------------
    async def offer(self, prefix: KVPrefix | None) -> dict:
        """disaggregated_params for a finished prefill; no prefix, or an empty one (a prompt within one
        block), has none."""
        if prefix is None or prefix.num_blocks == 0:
            return {KEY: None}
        import dynamo.nixl_connect as nc

        readable = await self.connector.create_readable(nc.Descriptor(prefix.data))
        task = asyncio.create_task(self._hold(readable, prefix))
        self._held.add(task)
        task.add_done_callback(self._held.discard)
        self.offered += 1
        return {KEY: {"nixl": readable.metadata().model_dump(mode="json"),
                      "hashes": [format(h, "x") for h in prefix.hashes],
                      "shape": list(prefix.data.shape), "dtype": str(prefix.data.dtype).removeprefix("torch.")}}

    async def _hold(self, readable, prefix: KVPrefix) -> None:
        try:
            await asyncio.wait_for(readable.wait_for_completion(), self.hold_s)
        except (asyncio.TimeoutError, Exception) as e:  # nobody read it: drop the copy
            log.warning("KV handoff of %d blocks not read within %.0f s (%s)", prefix.num_blocks, self.hold_s,
                        type(e).__name__)

    # ---- decode side ---------------------------------------------------------------------------------
    async def fetch(self, prefill_result: dict | None) -> KVPrefix | None:
        """The prefill worker's KV (None when it sent none or the read failed; the caller recomputes)."""
        meta = ((prefill_result or {}).get("disaggregated_params") or {}).get(KEY)
        if not meta:
            return None
        import dynamo.nixl_connect as nc

        t0 = time.perf_counter()
        try:
            data = torch.empty(meta["shape"], dtype=getattr(torch, meta["dtype"]))
            op = await self.connector.begin_read(nc.RdmaMetadata.model_validate(meta["nixl"]), nc.Descriptor(data))
            await asyncio.wait_for(op.wait_for_completion(), self.read_timeout_s)
        except Exception as e:
            self.failed += 1
            log.warning("KV handoff read failed (%s: %s); the prompt is computed here", type(e).__name__, e)
            return None
        self.fetched += 1
        log.debug("KV handoff: %d bytes read in %.1f ms", data.numel() * data.element_size(),
                  1e3 * (time.perf_counter() - t0))
        return KVPrefix([int(h, 16) for h in meta["hashes"]], data)

    def summary(self) -> str:
        return (f"KV handoff: {self.offered} offered, {self.fetched} read, {self.imported_blocks} blocks imported, "
                f"{self.failed} failed")
