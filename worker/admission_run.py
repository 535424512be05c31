"""`conductor admission run ... -- COMMAND`: run a process only under an admitted lease.

In the spirit of `flock(1)` and Slurm's `srun`, for provider-native agent loops and scripts on a
shared host (AIWG: "provider ownership of an interactive loop does not bypass shared-host quotas").
It asks the host group's admission singleton for a lease (`worker.lease`), says on stderr where it
waits, starts the command once admitted, renews while it runs, gives the lease back when it ends and
exits with its status. The command runs in a process group of its own, in the terminal's
foreground when there is one, so a stop reaches everything it started.

Its exit statuses: the table in docs/admission-api.md ("wrap a process"), the one place they are written.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Sequence

from temporalio.client import Client

from substrate.procs import signal_group, terminate_group
from worker.lease import HeldLease, NotAdmitted, acquire, kept
from workflows.admission.holders import HeldRequest
from workflows.admission.messages import AdmissionDecision, queue_place

EXIT_NOT_ADMITTED = 69  # EX_UNAVAILABLE
EXIT_LEASE_LOST = 75  # EX_TEMPFAIL: worth trying again
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
PROG = "conductor admission run"
# The command starts through this trampoline, a fresh single-threaded Python: it asks Linux to
# SIGKILL it when the wrapper dies (prctl PR_SET_PDEATHSIG), makes sure the wrapper has not died
# already, and execs the command, which keeps the setting. So a wrapper killed outright takes its
# command with it, and the lease that then expires at its TTL was not guarding a process still
# running. Done in the forked child of the wrapper itself (`preexec_fn`), the prctl needed a
# dlopen while the SDK's threads run, which can deadlock the child (Python's docs warn of it).
# Elsewhere than Linux, or without prctl, the command runs without it.
_TRAMPOLINE = """
import ctypes, os, sys
wrapper, command = int(sys.argv[1]), sys.argv[2:]
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
except (OSError, AttributeError):
    pass
if os.getppid() != wrapper:
    sys.exit(137)  # the wrapper died before the setting took: do not start the command
try:
    os.execvp(command[0], command)
except OSError as error:
    print(f"conductor admission run: cannot run {command[0]}: {error.strerror or error}", file=sys.stderr, flush=True)
    sys.exit(127 if isinstance(error, FileNotFoundError) else 126)
"""


def say(line: str) -> None:
    print(f"{PROG}: {line}", file=sys.stderr, flush=True)


def queued_line(decision: AdmissionDecision) -> str:
    return f"request {decision.request_id} queued: {queue_place(decision.position, decision.binding_constraint, eta=decision.eta)}"


class _Relay:
    """SIGINT, SIGTERM and SIGHUP for the wrapper's whole life, never left to their default (which
    would kill the wrapper and orphan its command): until the command runs they are kept and
    withdraw the request if it still waits; once it runs they go to its process group. One handler
    throughout: asyncio runs a signal's handler a loop iteration after the signal, so a handler
    swapped for another meanwhile would lose it."""

    def __init__(self) -> None:
        self.pending: list[int] = []
        self.withdraw = asyncio.Event()
        self._group: int | None = None

    def __call__(self, signum: int) -> None:
        if self._group is None:
            self.pending.append(signum)
            self.withdraw.set()
        else:
            signal_group(self._group, signum)

    def to(self, group: int | None) -> None:
        """Pass signals to `group` from now on (None: keep them), those kept so far first."""
        self._group = group
        if group is not None:
            for signum in self.pending:
                signal_group(group, signum)
        self.pending.clear()


async def run_command(
    client: Client, host_group: str, request: HeldRequest, command: Sequence[str], *, holder: str, grace_seconds: float,
) -> int:
    loop = asyncio.get_running_loop()
    relay = _Relay()
    for signum in FORWARDED:
        loop.add_signal_handler(signum, relay, signum)
    try:
        try:
            lease = await acquire(
                client, host_group, request, holder=holder, on_queued=lambda d: say(queued_line(d)), withdraw=relay.withdraw,
            )
        except NotAdmitted as refused:
            if relay.pending:
                say(f"interrupted while queued: request {request.request_id} withdrawn; the command did not run")
                return 128 + relay.pending[0]
            say(f"not admitted: {refused}; the command did not run")
            return EXIT_NOT_ADMITTED
        say(f"admitted: request {request.request_id} holds a lease on host group {host_group} "
            f"(revision {lease.decision.lease_revision}); running {command[0]}")
        async with kept(lease):
            return await _run_under(lease, command, grace_seconds, relay)
    finally:
        for signum in FORWARDED:
            loop.remove_signal_handler(signum)


async def _run_under(lease: HeldLease, command: Sequence[str], grace_seconds: float, relay: _Relay) -> int:
    await asyncio.sleep(0)  # a signal that came with the admission has run its handler
    if relay.pending:  # it came while the request waited or as it was admitted
        say(f"interrupted ({signal.Signals(relay.pending[0]).name}) before the command started; it did not run")
        return 128 + relay.pending[0]
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-I", "-S", "-c", _TRAMPOLINE, str(os.getpid()), *command, process_group=0,
    )
    with _foreground(process.pid):
        relay.to(process.pid)
        ended = asyncio.ensure_future(process.wait())
        lost = asyncio.ensure_future(lease.lost.wait())
        try:
            await asyncio.wait({ended, lost}, return_when=asyncio.FIRST_COMPLETED)
            if not ended.done():
                say(f"lease lost ({lease.lost_reason}); stopping the command (SIGTERM, SIGKILL after {grace_seconds:g} s)")
                await terminate_group(process, grace_seconds)
                return EXIT_LEASE_LOST
        finally:
            lost.cancel()
            relay.to(None)  # the group is gone: nothing to pass signals to while the lease goes back
    status = process.returncode or 0
    return 128 - status if status < 0 else status


@contextlib.contextmanager
def _foreground(pgid: int):
    """Give the terminal to the command's process group while it runs (an interactive agent loop
    reads it, and Ctrl-C reaches it), and take it back after; nothing without a terminal."""
    try:
        fd = os.open("/dev/tty", os.O_RDWR)
    except OSError:
        yield
        return
    previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        mine = os.tcgetpgrp(fd)
        os.tcsetpgrp(fd, pgid)
    except OSError:
        signal.signal(signal.SIGTTOU, previous)
        os.close(fd)
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.tcsetpgrp(fd, mine)
        signal.signal(signal.SIGTTOU, previous)
        os.close(fd)
