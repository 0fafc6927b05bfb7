"""``POST /_reroll/freeze``: with a `FreezePlan`, the proxy takes the sandbox's pool snapshot itself at
each step it would hold and lets the request go on at once, with no release (`reroll_proxy.rollout`);
on a real loop-mounted btrfs. A snapshot that fails is told to the controller, the request goes on."""

from __future__ import annotations

import concurrent.futures
import errno
from pathlib import Path

import pytest
from reroll.sandbox.docker.disk import SizedDisk
from reroll.sandbox.local import cow
from reroll_contracts.btrfs import PATHS, create_subvolume
from reroll_contracts.proxy import FreezePlan

from tests.conftest import NEEDS_BTRFS
from tests.proxy.conftest import CONTROLLER_TOKEN, TURNS, Service, StartProxy, converse, http_json, post_place

pytestmark = NEEDS_BTRFS
CONTROLLER = {"Authorization": f"Bearer {CONTROLLER_TOKEN}"}


def test_a_frozen_step_is_snapshotted_read_only_and_not_held(
    start_proxy: StartProxy, scripted_model: Service, btrfs_disk: SizedDisk
) -> None:
    base = btrfs_disk.mountpoint
    for name in ("app", "root"):
        create_subvolume(base / name)
    (base / "snapshots").mkdir()
    (base / "app" / "file").write_text("at step 2")
    plan = FreezePlan(
        snapshots=base / "snapshots", sources=[base / "app"], paths=["/app"], root=base / "root"
    )
    proxy = start_proxy(upstream_url=scripted_model.base_url, hold_every=2)
    assert post_place(proxy, plan.model_dump(mode="json"), CONTROLLER, "/_reroll/freeze") == 204
    assert post_place(proxy, {"snapshots": "/x"}, CONTROLLER, "/_reroll/freeze") == 400
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        agent = pool.submit(converse, proxy.client(), TURNS, stream=False)
        agent.result(timeout=30)  # never released: step 2 went on after its snapshot
        status, _, held = http_json("GET", proxy.root_url + "/_reroll/held", headers=CONTROLLER)
    assert (status, held["step"], held["frozen"], held["error"]) == (200, 2, True, None)
    assert 0 < held["held_seconds"] < 10
    frozen = base / "snapshots" / "step-2"
    assert (frozen / PATHS).read_text() == "/app" and cow.is_subvolume(frozen / "root")
    assert (frozen / "0" / "file").read_text() == "at step 2"
    with pytest.raises(OSError) as raised:
        (frozen / "0" / "file").write_text("changed")
    assert raised.value.errno == errno.EROFS
    assert [line["metadata"]["step"] for line in proxy.lines()] == [0, 1, 2]


def test_a_failed_freeze_is_told_and_the_request_goes_on(
    start_proxy: StartProxy, scripted_model: Service, tmp_path: Path
) -> None:
    plan = FreezePlan(snapshots=tmp_path, sources=[tmp_path / "not-a-subvolume"], paths=["/app"])
    proxy = start_proxy(upstream_url=scripted_model.base_url, hold_every=2)
    assert post_place(proxy, plan.model_dump(mode="json"), CONTROLLER, "/_reroll/freeze") == 204
    converse(proxy.client(), TURNS, stream=False)
    _, _, held = http_json("GET", proxy.root_url + "/_reroll/held", headers=CONTROLLER)
    assert held["step"] == 2 and held["frozen"] and "not-a-subvolume" in held["error"]
    assert not (tmp_path / "step-2" / PATHS).exists()
