"""Worker configuration from the environment, with defaults that suit the embedded dev stack."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from activities.stores import DATABASE_URL_ENV, DatabaseURLError, check_database_url
from worker.inputs import InputError, read_json
from workflows.admission.messages import ADMISSION_TASK_QUEUE
from workflows.admission.model import AdmissionPolicy

# The local substrate isolates workloads as host processes; the engine serialises the `host`
# tier unless told otherwise, so the default policy lets a laptop run eight at once.
DEFAULT_POLICY = AdmissionPolicy(max_concurrent=8, runtime_quotas={"host": 8}, lease_ttl_seconds=60)
# The bundled local substrate's default address; both planes share it (tokens differ).
DEFAULT_SUBSTRATE_URL = "http://127.0.0.1:8787"


@dataclass(frozen=True)
class WorkerConfig:
    data_dir: Path
    task_queue: str = ADMISSION_TASK_QUEUE
    admission_policy: AdmissionPolicy = DEFAULT_POLICY
    fleet_url: str = DEFAULT_SUBSTRATE_URL
    executor_url: str = DEFAULT_SUBSTRATE_URL
    # PostgreSQL for the ledger and audit stores (activities/stores.py); None: the SQLite files below.
    database_url: str | None = None
    # Worker Deployment Versioning (worker/worker.py): both set, or neither (no versioning).
    deployment_name: str | None = None
    build_id: str | None = None

    @property
    def audit_db(self) -> Path:
        return self.data_dir / "audit.sqlite"

    @property
    def ledger_db(self) -> Path:
        return self.data_dir / "ledger.sqlite"

    def policy_for(self, host_group: str) -> AdmissionPolicy:
        """The policy a host group's admission workflow starts with (operators change it live)."""
        return self.admission_policy

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> "WorkerConfig":
        env = os.environ if environ is None else environ
        policy = DEFAULT_POLICY
        policy_file = env.get("CONDUCTOR_ADMISSION_POLICY")
        if policy_file:
            policy = _policy_from_file(policy_file)
        substrate_url = env.get("CONDUCTOR_SUBSTRATE_URL", DEFAULT_SUBSTRATE_URL)
        try:
            database_url = check_database_url(env.get(DATABASE_URL_ENV))
        except DatabaseURLError as error:
            raise InputError(str(error)) from None
        return cls(
            data_dir=Path(env.get("CONDUCTOR_DATA_DIR", ".conductor")),
            task_queue=env.get("CONDUCTOR_TASK_QUEUE", ADMISSION_TASK_QUEUE),
            admission_policy=policy,
            fleet_url=substrate_url,
            executor_url=substrate_url,
            database_url=database_url,
            **deployment_version(env.get(DEPLOYMENT_NAME_ENV), env.get(BUILD_ID_ENV)),
        )


DEPLOYMENT_NAME_ENV = "CONDUCTOR_DEPLOYMENT_NAME"
BUILD_ID_ENV = "CONDUCTOR_BUILD_ID"


def deployment_version(deployment_name: str | None, build_id: str | None) -> dict[str, str | None]:
    """The two versioning fields, refused as InputError (one line) unless both or neither are given:
    half a version would either silently run unversioned or fail deep inside the SDK."""
    if bool(deployment_name) != bool(build_id):
        raise InputError(
            f"worker versioning needs both {DEPLOYMENT_NAME_ENV} (--deployment-name) and {BUILD_ID_ENV} "
            "(--build-id), or neither; set the missing one"
        )
    return {"deployment_name": deployment_name or None, "build_id": build_id or None}


def _policy_from_file(path: str) -> AdmissionPolicy:
    """CONDUCTOR_ADMISSION_POLICY, through the CLI's front door: InputError (one line) if unusable."""
    data = read_json(path, "admission policy (CONDUCTOR_ADMISSION_POLICY)")
    try:
        return AdmissionPolicy.model_validate(data)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in item['loc']) or '(document)'}: {item['msg']}" for item in error.errors()
        )
        raise InputError(f"invalid admission policy {path} (CONDUCTOR_ADMISSION_POLICY): {problems}") from None
