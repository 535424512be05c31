"""`conductor worker`: one worker against an existing Temporal and substrate, until Ctrl-C.

Temporal comes from environment configuration (worker/connection.py: profile file,
TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, TLS, API key); the substrate from
CONDUCTOR_SUBSTRATE_URL and its tokens from CONDUCTOR_FLEET_TOKEN / CONDUCTOR_EXECUTOR_TOKEN
(or their `_FILE` variants). `conductor dev` prints the exports for its stack.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
from pathlib import Path

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from activities.credentials import MissingCredential, executor_token, fleet_token
from activities.fleet import FleetActivities
from worker.config import BUILD_ID_ENV, DEPLOYMENT_NAME_ENV, WorkerConfig
from worker.connection import ConnectionSettingError, connect_options, connect_patiently
from worker.metrics import MetricsSettingError, metrics_address, metrics_runtime
from worker import search_attributes
from worker.signals import stop_requested
from worker.worker import build_worker, take_over_singletons


def register(subparsers: argparse._SubParsersAction) -> None:
    worker = subparsers.add_parser(
        "worker",
        help="run a worker against an existing Temporal (envconfig) and substrate (CONDUCTOR_SUBSTRATE_URL)",
        description="Temporal: TEMPORAL_ADDRESS / TEMPORAL_NAMESPACE / a profile. Substrate: CONDUCTOR_SUBSTRATE_URL, "
        "tokens CONDUCTOR_FLEET_TOKEN and CONDUCTOR_EXECUTOR_TOKEN (or *_FILE). Options override the environment.",
        allow_abbrev=False,
    )
    worker.add_argument(
        "--profile", help="Temporal environment-configuration profile (default: conductor --profile, then TEMPORAL_PROFILE)"
    )
    worker.add_argument("--substrate-url", help="substrate base URL (default: CONDUCTOR_SUBSTRATE_URL)")
    worker.add_argument("--task-queue", help="task queue (default: CONDUCTOR_TASK_QUEUE or mission-conductor)")
    worker.add_argument("--data-dir", type=Path, help="audit and ledger stores (default: CONDUCTOR_DATA_DIR or .conductor)")
    worker.add_argument(
        "--metrics-address", metavar="HOST:PORT",
        help="serve Prometheus metrics (the SDK's and the product's) at http://HOST:PORT/metrics "
        "(default: CONDUCTOR_METRICS_ADDRESS; unset: no metrics)",
    )
    worker.add_argument("--deployment-name", help="worker versioning: deployment name (default: CONDUCTOR_DEPLOYMENT_NAME)")
    worker.add_argument("--build-id", help="worker versioning: this build's id (default: CONDUCTOR_BUILD_ID)")
    worker.set_defaults(func=run_worker)


def _config(args: argparse.Namespace) -> WorkerConfig:
    env = dict(os.environ)
    for name, value in ((DEPLOYMENT_NAME_ENV, args.deployment_name), (BUILD_ID_ENV, args.build_id)):
        if value:
            env[name] = value
    config = WorkerConfig.from_env(env)
    changes: dict[str, object] = {}
    if args.substrate_url:
        changes.update(fleet_url=args.substrate_url, executor_url=args.substrate_url)
    if args.task_queue:
        changes["task_queue"] = args.task_queue
    if args.data_dir:
        changes["data_dir"] = args.data_dir
    return dataclasses.replace(config, **changes)


async def _namespace_problem(client: Client, namespace: str) -> str | None:
    """What the namespace lacks for missions to run (checked before polling), or None."""
    try:
        found = await search_attributes.check(client, namespace)
    except RPCError as error:
        if error.status == RPCStatusCode.NOT_FOUND:
            return (
                f"there is no namespace {namespace} on this server: create it (`temporal operator namespace create "
                f"--namespace {namespace}`), or name the right one (--namespace, TEMPORAL_NAMESPACE or the profile)"
            )
        # Not allowed to list them (e.g. a narrow API key): the worker runs, unchecked.
        print(
            f"conductor worker: warning: could not check the search attributes of namespace {namespace} "
            f"({error.message}); missions hang if any is missing (docs/operations.md lists them)",
            file=sys.stderr,
        )
        return None
    return None if found.ok else found.problem()


def run_worker(args: argparse.Namespace) -> int:
    try:
        config = _config(args)
        metrics = metrics_address(args.metrics_address)
    except (OSError, ValueError) as error:
        print(f"conductor worker: invalid configuration: {error}", file=sys.stderr)
        return 2
    return asyncio.run(_serve(config, args.profile, metrics))


async def _executor_kind(config: WorkerConfig) -> str:
    """Which kind of executor the worker dispatches to (probed again whenever a mission plans)."""
    probe = FleetActivities.from_environment(config.fleet_url, config.executor_url, http_timeout=5.0)
    try:
        if not probe.configured:
            return "not probed: the worker has no tokens for it"
        if await probe.fleet_api():
            return "serves the fleet API"
        return ("has no fleet API: one-shot commands and persistent agents run over A2A with records kept by the "
                "conductor; daemons and scheduled collectors are refused as unsupported")
    except Exception as error:  # not up yet, say: every mission's planning probes again
        return f"could not be probed yet ({str(error)[:200]}); probed again when a mission plans"
    finally:
        await probe.aclose()


async def _serve(config: WorkerConfig, profile: str | None, metrics: str | None = None) -> int:
    with stop_requested() as stop:
        try:
            runtime = {"runtime": metrics_runtime(metrics)} if metrics else {}
        except MetricsSettingError as error:
            print(f"conductor worker: {error}", file=sys.stderr)
            return 2
        try:
            options = connect_options(profile)
            client = await connect_patiently(profile, **runtime)
        except (ConnectionError, ConnectionSettingError) as error:
            print(f"conductor worker: {error}", file=sys.stderr)
            return 1
        problem = await _namespace_problem(client, options["namespace"])
        if problem is not None:
            print(f"conductor worker: {problem}", file=sys.stderr)
            return 2
        try:
            fleet_token()
            executor_token()
        except MissingCredential as error:
            # The worker still runs workflows that need no substrate; fleet activities will fail with this.
            print(f"conductor worker: warning: substrate activities will fail: {error}", file=sys.stderr)
        config.data_dir.mkdir(parents=True, exist_ok=True)
        async with build_worker(client, config):
            try:
                await take_over_singletons(client, config.task_queue)
            except Exception as error:  # visibility unavailable, say: the sticky timeout still applies
                print(f"conductor worker: warning: could not take over the admission singletons at once: {error}", file=sys.stderr)
            print(
                f"conductor worker: polling task queue {config.task_queue} on {options['target_host']} "
                f"(namespace {options['namespace']}); substrate {config.fleet_url}; data {config.data_dir}"
                f"{f'; metrics http://{metrics}/metrics' if metrics else ''}"
                f"{f'; version {config.deployment_name}.{config.build_id} (pinned)' if config.build_id else ''}. "
                "Ctrl-C to stop.",
                flush=True,
            )
            print(f"conductor worker: executor {config.fleet_url} {await _executor_kind(config)}", flush=True)
            await stop.wait()
            print("conductor worker: stopping ...", flush=True)
    print("conductor worker: stopped", flush=True)
    return 0
