"""`posttrain operator`: run the controller for RLJob, SFTJob and TaskApp (the same code as the operator
Deployment). Watches every namespace unless --namespace is given (repeatable: a namespaced install lists the
namespaces it may act in). Settings come from POSTTRAIN_* env vars
(see posttrain/controller/settings.py), e.g. POSTTRAIN_TRAINER_IMAGE, POSTTRAIN_S3_ENDPOINT."""

from __future__ import annotations

import argparse
import logging
import os

# Shown at the end of --help (cli.py adds them).
EXAMPLES = """\
  posttrain operator                            # every namespace, from $KUBECONFIG
  posttrain operator --namespace team-a --namespace team-b
  posttrain operator --peering posttrain --liveness http://0.0.0.0:8080/healthz
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "operator",
        help="run the operator (kopf) for RLJob, SFTJob and TaskApp",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--namespace",
        "-n",
        action="append",
        help="watch only this namespace; repeat for several (default: all, or $POSTTRAIN_NAMESPACE)",
    )
    parser.add_argument(
        "--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)"
    )
    parser.add_argument(
        "--peering", help="kopf peering object name (needs the kopf peering CRDs); default: standalone"
    )
    parser.add_argument("--priority", type=int, default=0, help="peering priority")
    parser.add_argument(
        "--liveness", default=None, help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz (default: off)"
    )
    parser.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    if not args.verbose:  # kopf logs every handler call at INFO: thousands of lines with many jobs
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig  # kopf's login reads it too
    from posttrain.controller.main import run as run_operator
    from posttrain.controller.settings import load_settings

    run_operator(
        settings=load_settings(),
        kubeconfig=args.kubeconfig,
        namespaces=args.namespace or (),
        peering=args.peering,
        priority=args.priority,
        liveness=args.liveness,
    )
    return 0
