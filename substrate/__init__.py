"""The bundled local execution substrate: the Agentic Sandbox HTTP API over local processes.

It speaks the same wire contract as a real Agentic Sandbox (docs/design.md, "Wire contract with Agentic Sandbox"), so
the worker cannot tell them apart: a management plane for Fleet Workload v1 records and an
A2A executor plane whose tasks run as `/bin/sh -c` process groups on this machine.

Modules, one job each: `app` (routes), `auth` (bearer tokens with roles, the token file),
`health` (unauthenticated health routes), `body` (request limits, JSON decoding), `fleet`
(admission, CAS observations, inventory, reconciliation), `executor` (A2A dispatch), `runner`
(processes per workload kind), `adoption` (processes re-adopted after a restart), `procs`
(process groups), `cron` (schedules), `store` (SQLite), `config` (settings and limits), `server`
(foreground / thread / subprocess startup), `cli` (`conductor substrate serve`).

In-process use (tests, the embedded dev stack)::

    from substrate.config import SubstrateConfig
    from substrate.server import serve_in_thread

    with serve_in_thread(SubstrateConfig(fleet_token, executor_token, data_dir=path, port=0,
                                         instances=4)) as running:
        ...  # running.base_url, e.g. "http://127.0.0.1:41877"; targets local-1..local-4
"""
