"""The ``promesa-receiver`` command. ``check``: run the receiver check against an endpoint. ``listen``: forward a
pull subscription's deliveries to an app on this machine."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Sequence

from . import check, listen


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="promesa-receiver", description="Tools for receivers of Promesa webhooks.")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser(
        "check", help="test an endpoint against the receiver contract",
        description="Send the receiver check's requests (signed, duplicate, forged, stale, tampered) to URL and "
                    "say, rule by rule, what to fix. Exit 1 if any rule failed. Loopback URLs are allowed.")
    run.add_argument("url", metavar="URL", help="the endpoint, e.g. http://127.0.0.1:8000/webhooks/promesa")
    run.add_argument("--secret", action="append", required=True, metavar="S",
                     help="the signing secret (whsec_...); repeat it while a secret rotates: each request is "
                          "signed with all of them, as Promesa signs deliveries")
    run.add_argument("--scheme", choices=("promesa", "standard"), default="promesa",
                     help="the signature scheme: promesa (X-Signature) or standard (Standard Webhooks)")
    run.add_argument("--header", action="append", default=[], metavar="'NAME: VALUE'", dest="headers",
                     help="a header of the endpoint's own (an API key its gateway demands), sent with every request "
                          "but one: that one goes without, and rule credentials_required expects it refused. "
                          "Repeat it for more than one")
    run.add_argument("--json", action="store_true", help='print {"id", "results"} as JSON instead of the report')
    run.add_argument("--timeout", type=float, default=check.TIMEOUT_SECONDS, metavar="SECONDS",
                     help=f"how long to wait for each answer (default {check.TIMEOUT_SECONDS:.0f}, Promesa's limit)")
    forwarding = commands.add_parser(
        "listen", help="forward a pull subscription's deliveries to your app on this machine",
        description="Make a temporary pull subscription (a listen session) and print its signing secret once, "
                    "then forward each delivery to your app with its exact body and signature headers, and "
                    "acknowledge it with your app's answer. Ctrl-C ends it and deletes the subscription; Promesa "
                    "deletes one left behind once idle.")
    forwarding.add_argument("--forward-to", required=True, metavar="URL",
                            help="your app's endpoint, on a loopback address or one of this machine's, e.g. "
                                 "http://127.0.0.1:8000/webhooks/promesa")
    forwarding.add_argument("--events", action="append", metavar="PATTERN",
                            help="an event type or pattern such as 'invoice.*'; repeat it for more (default: '*', "
                                 "every type)")
    forwarding.add_argument("--consumer", metavar="UID",
                            help="listen as this consumer's endpoint: the events addressed to it")
    forwarding.add_argument("--url", default=listen.DEFAULT_URL, metavar="URL",
                            help=f"Promesa's address (default {listen.DEFAULT_URL})")
    forwarding.add_argument("--token", help=f"a team's API token (default: ${listen.TOKEN_VARIABLE})")
    forwarding.add_argument("--subscription", metavar="SUB_ID",
                            help="attach to this existing pull subscription instead of making one; it is not "
                                 "deleted at the end")
    return parser


# An RFC 9110 token, and a value of printable ASCII (what the check may send as it is).
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_HEADER_VALUE = re.compile(r"[\x20-\x7e]*")


def _headers(given: list[str]) -> dict[str, str]:
    """--header 'Name: value' arguments as a dict; a usage error names the argument by its name only (the
    value is a credential: never echoed)."""
    headers: dict[str, str] = {}
    for argument in given:
        name, colon, value = argument.partition(":")
        name, value = name.strip(), value.strip()
        if not colon or not _HEADER_NAME.fullmatch(name):
            _parser().error("--header must be 'Name: value' with a name of letters, digits and !#$%&'*+-.^_`|~ "
                            f"(got a header {'without a colon' if not colon else 'whose name is not a token'})")
        if not value or not _HEADER_VALUE.fullmatch(value):
            _parser().error(f"--header {name}: the value must be printable ASCII, not empty")
        if any(name.lower() == other.lower() for other in headers):
            _parser().error(f"--header {name} is given twice")
        headers[name] = value
    return headers


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "listen":
        return _listen(args)
    if args.timeout <= 0:
        _parser().error("--timeout must be more than 0 seconds")
    if not args.url.startswith(("http://", "https://")):
        _parser().error("URL must start with http:// or https://")
    headers = _headers(args.headers)
    try:
        check_id, results = check.run_check(args.url, args.secret, args.scheme, timeout=args.timeout,
                                            allow_private=True, headers=headers)
    except ValueError as exc:  # a bad secret (e.g. not whsec_<base64> for the standard scheme)
        _parser().error(str(exc))
    if args.json:
        print(json.dumps({"id": check_id, "results": results}, indent=2))
    else:
        print(check.report(args.url, check_id, results))
    return 1 if check.failed(results) else 0


def _listen(args: argparse.Namespace) -> int:
    """Usage errors first (nothing is made on Promesa for a command that cannot run), then the session."""
    token = args.token or os.environ.get(listen.TOKEN_VARIABLE)
    if not token:
        _parser().error(f"listen needs a team's API token: give --token or set {listen.TOKEN_VARIABLE}")
    if not args.url.startswith(("http://", "https://")):
        _parser().error("--url must be Promesa's http:// or https:// address")
    if args.subscription and (args.events or args.consumer):
        _parser().error("--events and --consumer describe a new listen session; an attached --subscription "
                        "keeps its own")
    try:
        target = listen.forward_target(args.forward_to)
    except ValueError as exc:
        _parser().error(str(exc))
    return listen.listen(listen.Promesa(args.url, token), target, event_types=args.events or ["*"],
                         consumer=args.consumer, subscription_id=args.subscription)


if __name__ == "__main__":
    sys.exit(main())
