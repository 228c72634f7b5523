"""`blendrag keys create|list|revoke`: collection keys, straight in the catalog (registered by app/cli/__init__.py).

They work whether or not a server runs on the data dir: the catalog is shared, and every server refuses a
revoked key within `server.key_cache_s`.
"""

from __future__ import annotations

import argparse
import sys

from app.cli.common import EXIT_USAGE, add_data_dir
from app.settings import load_settings


def cmd_keys(args: argparse.Namespace) -> int:
    from app.build import build_services
    from app.services.key_service import KeyRequestError

    settings = load_settings(data_dir=getattr(args, "data_dir", None))
    if args.keys_command == "create" and not settings.server.api_key:
        print(
            "error: set server.api_key (the admin key) before making collection keys: without it the server "
            "is open, and a first collection key would lock anonymous questions out",
            file=sys.stderr,
        )
        return EXIT_USAGE
    services = build_services(settings, {"keys"})  # the catalog only
    try:
        service = services.keys
        assert service is not None
        match args.keys_command:
            case "create":
                try:
                    created = service.create(args.name, args.collection, args.ingest)
                except KeyRequestError as exc:
                    print(f"error: {exc}", file=sys.stderr)
                    return EXIT_USAGE
                record = created.record
                rights = "read and ingest" if record.can_ingest else "read"
                print(f"key {record.id} ({record.name}): {rights} {', '.join(record.collections)}")
                print(f"secret (shown once, stored only as a hash): {created.secret}")
            case "list":
                keys = service.list()
                if not keys:
                    print("no collection keys")
                for k in keys:
                    used = k.last_used_at.isoformat(timespec="seconds") if k.last_used_at else "never"
                    created_at = k.created_at.isoformat(timespec="seconds")
                    print(
                        f"{k.id}  {k.name}  collections={','.join(k.collections)}  "
                        f"ingest={'yes' if k.can_ingest else 'no'}  created={created_at}  last_used={used}"
                    )
            case "revoke":
                if not service.revoke(args.key_id):
                    print(f"error: no key {args.key_id}", file=sys.stderr)
                    return 1
                print(f"key {args.key_id} revoked")
    finally:
        services.close()
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("keys", help="collection keys: create, list, revoke (needs server.api_key)")
    ksub = p.add_subparsers(dest="keys_command", required=True)
    kp = ksub.add_parser("create", help="make a key for some collections; prints its secret once")
    kp.add_argument("name", help="who the key is for")
    kp.add_argument(
        "--collection", action="append", required=True, metavar="NAME", help="a collection it may read (repeat)"
    )
    kp.add_argument("--ingest", action="store_true", help="it may also ingest into and delete from them")
    add_data_dir(kp)
    kp = ksub.add_parser("list", help="every key (never the secrets)")
    add_data_dir(kp)
    kp = ksub.add_parser("revoke", help="revoke a key by its id")
    kp.add_argument("key_id")
    add_data_dir(kp)
    p.set_defaults(func=cmd_keys)
