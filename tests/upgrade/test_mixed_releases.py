"""Upgrades DC by DC (issue 49): the previous release and this one side by side, on real
processes, under the nemesis's load and with its checks.

Every DC starts on the previous release (its source from git history, tests/support/
releases.py). Then, while a client per DC keeps inserting: dc1 is upgraded, dc2 is
upgraded and rolled back (this release's txlog and worker databases opened by the
previous one), then dc2 and dc3 are upgraded. A switch stops a DC's services as a pod
restart would (SIGTERM) and starts the other release's on the same data; each waits
until every DC's client has been acknowledged again. At the end the nemesis's checks
hold (tests/support/nemesis.py): one order at every DC, every acknowledged row once on
every worker, the workers at one position with one digest. The stores truncate and
rotate as in the nemesis, so the previous release opens logs this one truncated and
rotated, and this one logs the previous one rotated.

The previous release's stores keep what finished in the last ``PREVIOUS_KEPT_MS``, as
docs/operations.md tells an operator upgrading from 0.1.0 to do: 0.1.0 takes a peer's
synced length as its progress, and truncated the bodies a DC back from its switch had
ordered and not fetched yet (fixed since, 69be6c2). In a fresh-clone CI run dc1's
workers stopped at 398 for good, healthy; made again by keeping dc1 down for 45 s and
its links slow after: it stopped at 941, the body of 942 held by no DC.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.nemesis import HISTORY_KEPT, NemesisRun
from tests.support.releases import CURRENT, Release, previous_release
from txsync.dev_cluster import STOP_TIMEOUT_S, Service

pytestmark = pytest.mark.under_load  # a busy machine: see tests/conftest.py

PROGRESS_TIMEOUT_S = 300.0
"""For every DC's client to be acknowledged again after a switch: generous, since a
loaded machine restarts a DC's services slowly."""
ACKNOWLEDGED_AFTER_SWITCH = 20
"""Transactions each DC's client has acknowledged after a switch before the next."""
PREVIOUS_KEPT_MS = 2 * PROGRESS_TIMEOUT_S * 1000
"""``--history-kept-ms`` of the previous release's stores: longer than a switch may take
(docs/operations.md, "Upgrading from 0.1.0")."""
UNPASSED_MAX = HISTORY_KEPT + 200
"""``--unpassed-max`` of this release's stores (the least they start with, plus room):
the history passes it while a peer runs 0.1.0, whose posts say it holds no bodies. A
fresh-clone CI run with the default (4,096) found dc1 and dc2 refusing every submit for
good once the history passed that while dc3 was the last on 0.1.0 (flow control
counted dc3 at 0, not by its order); with this bound a local run did the same in a
minute (dc3's client alone acknowledged, 692 -> 13,111), and passes with the fix."""


class MixedReleaseRun(NemesisRun):
    def __init__(self, previous: Release, root: Path) -> None:
        super().__init__(seed=0, duration_s=0.0, root=root / "cluster")
        self.unpacked = {CURRENT: None, previous: previous.unpack(root / "previous")}
        self.previous = previous
        self.args = {service.name: service.command[3:] for service in self.cluster.services}
        """Each service's flags, from this checkout's builders: a flag the previous
        release does not know fails its start, as it would in a pod."""
        self.release_of: dict[str, Release] = {}
        for dc in self.dcs:
            self._use(dc, previous)

    def _services(self, dc: str) -> list[Service]:
        data = Path(self.layout["dcs"][dc]["data"])
        return [s for s in self.cluster.services if s.log_path.parent == data]

    def _use(self, dc: str, release: Release) -> None:
        for service in self._services(dc):
            args = self.args[service.name]
            if service.name.endswith("transaction-store") and release is CURRENT:
                args = [*args, "--unpassed-max", str(UNPASSED_MAX)]  # 0.1.0 does not know it
            if release is not CURRENT and "--history-kept-ms" in args:
                at = args.index("--history-kept-ms") + 1
                args = [*args[:at], str(int(PREVIOUS_KEPT_MS)), *args[at + 1 :]]
            service.command = release.command(self.unpacked[release], args)
        self.release_of[dc] = release

    def act(self) -> None:
        self._await_progress("every DC on the previous release")
        for dc, release in [
            ("dc1", CURRENT), ("dc2", CURRENT), ("dc2", self.previous),
            ("dc2", CURRENT), ("dc3", CURRENT),
        ]:  # fmt: skip
            self._switch(dc, release)
            mixed = ", ".join(f"{d} {r.name}" for d, r in self.release_of.items())
            self._await_progress(mixed)

    def _switch(self, dc: str, release: Release) -> None:
        """Stop the DC's services as a pod's restart does (its store last), and start them
        on ``release``."""
        self._log(f"switch: {dc} from {self.release_of[dc].name} to {release.name}")
        services = self._services(dc)
        needed = {needed for s in services for needed in s.needs}
        dependents = [s for s in services if s not in needed]
        for group in (dependents, [s for s in services if s in needed]):
            for service in group:
                service.stop()
            for service in group:
                service.wait_stopped(timeout_s=STOP_TIMEOUT_S)
        self._use(dc, release)
        self.cluster.start(timeout_s=PROGRESS_TIMEOUT_S, progress=self._log)

    def _await_progress(self, what: str) -> None:
        counts = [len(client.acknowledged) for client in self.clients]
        deadline = time.monotonic() + PROGRESS_TIMEOUT_S
        while True:
            self._supervise()
            now = [len(client.acknowledged) for client in self.clients]
            gained = [n - before for n, before in zip(now, counts, strict=True)]
            if min(gained) >= ACKNOWLEDGED_AFTER_SWITCH:
                self._log(f"progress with {what}: acknowledged {now}")
                return
            if time.monotonic() > deadline:
                tails = "\n".join(f"{s.name}:\n{s.log_tail()}" for s in self.cluster.services)
                raise AssertionError(
                    f"no progress with {what} in {PROGRESS_TIMEOUT_S:.0f} s: acknowledged "
                    f"{counts} -> {now}\n" + "\n".join(self.log_lines[-20:]) + "\n" + tails
                )
            time.sleep(0.2)


@pytest.mark.slow
def test_dcs_upgraded_one_at_a_time_and_one_rolled_back_keep_one_order(tmp_path: Path) -> None:
    previous = previous_release()
    run = MixedReleaseRun(previous, tmp_path)
    report = run.run()
    (tmp_path / "mixed-releases.log").write_text("\n".join(run.log_lines) + "\n")
    print(report.summary())
    switches = [line for line in run.log_lines if " switch: " in line]
    assert len(switches) == 5, run.log_lines
    failure = f"{report.summary()}: {report.problems[:5]} (previous: {previous})"
    assert not report.problems, f"{failure}\n{report.evidence}"
    assert report.lost == 0 and report.duplicated == 0, report.summary()
    assert report.acknowledged > 0 and report.ordered >= report.acknowledged, report.summary()
    assert report.truncated > 0 and report.rotations >= 1, report.summary()
