"""`blendrag serve`: the HTTP server on this data dir."""

from __future__ import annotations

import argparse
import logging

from app.cli.common import Refused, add_data_dir, busy_message, settings_of
from app.datadir_lock import lock_owner, server_url

logger = logging.getLogger(__name__)


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from app.main import create_app

    settings = settings_of(args)
    host = args.host or settings.server.host
    port = args.port or settings.server.port
    # The server records this address in the data-dir lock, for the CLI to find it.
    settings.server.host, settings.server.port = host, port
    owner = lock_owner(settings.data_dir)
    if owner is not None:
        raise Refused(busy_message(settings, owner, "blendrag serve"))
    from app.ports import PortInUse, check_port_free

    try:  # before anything loads: a port in use fails now, not after the model
        check_port_free(host, port)
    except PortInUse as exc:
        raise Refused(str(exc)) from exc
    # Start-up steps (model, embedder, "ready at …") are logged at info by our own packages.
    level = getattr(logging, settings.server.log_level.upper())
    for package in ("app", "engine", "kvcache", "retrieval", "ingest"):
        logging.getLogger(package).setLevel(min(level, logging.getLogger(package).getEffectiveLevel()))
    logger.info("starting the server for %s on %s", settings.data_dir, server_url(host, port))
    from app.access_log import install_polling_filter

    install_polling_filter()
    # proxy_headers off: the app applies X-Forwarded-For itself, trusting server.forwarded_allow_ips only.
    uvicorn.run(create_app(settings), host=host, port=port, log_level=settings.server.log_level, proxy_headers=False)
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run the HTTP server")
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=int, default=None)
    add_data_dir(p)
    p.set_defaults(func=cmd_serve)
