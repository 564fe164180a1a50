"""The ZMQ relay of Dynamo's event plane in broker mode, bound to loopback.

Dynamo 1.6.1's direct ZMQ event plane binds each publisher's PUB socket on ``0.0.0.0`` whatever
``DYN_EVENT_PLANE_HOST`` says (it only sets the advertised address). In broker mode
(``DYN_ZMQ_BROKER_URL="xsub=tcp://H:P1 , xpub=tcp://H:P2"``) publishers and subscribers *connect* to a
relay instead, so nothing of the event plane listens anywhere but here, on 127.0.0.1. The relay is
ZeroMQ's own XSUB/XPUB proxy device (``zmq.proxy``), as Dynamo's broker binary is.

    python -m tritonllm.dynamo.broker --xsub-port P1 --xpub-port P2
"""
from __future__ import annotations

import argparse


def broker_url(xsub_port: int, xpub_port: int) -> str:
    """The DYN_ZMQ_BROKER_URL value for this relay (Dynamo's format)."""
    return f"xsub=tcp://127.0.0.1:{xsub_port} , xpub=tcp://127.0.0.1:{xpub_port}"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="loopback XSUB/XPUB relay for Dynamo's event plane")
    ap.add_argument("--xsub-port", type=int, required=True)
    ap.add_argument("--xpub-port", type=int, required=True)
    args = ap.parse_args(argv)
    import zmq  # pyzmq is one of Dynamo's dependencies (build/dynamo-venv)

    ctx = zmq.Context.instance()
    xsub, xpub = ctx.socket(zmq.XSUB), ctx.socket(zmq.XPUB)
    xsub.bind(f"tcp://127.0.0.1:{args.xsub_port}")
    xpub.bind(f"tcp://127.0.0.1:{args.xpub_port}")
    try:
        zmq.proxy(xsub, xpub)  # until the process is terminated
    except (KeyboardInterrupt, zmq.ContextTerminated):
        pass


if __name__ == "__main__":
    main()
