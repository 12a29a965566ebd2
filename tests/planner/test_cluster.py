"""Tests of clusters: devices, links, presets and JSON."""

import json

import pytest

from kerasflow.planner import Cluster, Device, FileFormatError, InvalidClusterError, Link
from kerasflow.planner.ir.hardware import DEVICE_SPECS


def test_links_default_and_override():
    devices = [Device("/GPU:0", "V100", 2**34), Device("/GPU:1", "V100", 2**34)]
    cluster = Cluster(devices, Link(1e-5, 1e10), {("/GPU:0", "/GPU:1"): Link(0.0, 5e10)})
    assert cluster.transfer_time("/GPU:1", "/GPU:0", 1e10) == pytest.approx(1.00001)
    assert cluster.transfer_time("/GPU:0", "/GPU:1", 1e10) == pytest.approx(0.2)
    assert cluster.transfer_time("/GPU:0", "/GPU:0", 1e10) == 0.0
    assert cluster.slowest_link() == Link(1e-5, 1e10)


@pytest.mark.parametrize("name, count, kind", [
    ("2xK80-pcie", 2, "K80"), ("4xV100-pcie", 4, "V100"), ("4xV100-nvlink", 4, "V100"),
    ("8xA100-nvlink", 8, "A100"), ("8xH100-nvlink", 8, "H100"), ("2x8xV100", 16, "V100"),
    ("cpu-testbed:3", 3, "CPU"),
])
def test_presets(name, count, kind):
    cluster = Cluster.preset(name)
    assert len(cluster) == count and cluster.kinds() == [kind]
    assert cluster.devices[0].memory == DEVICE_SPECS[kind].memory


def test_two_host_preset_has_slow_links_between_hosts():
    cluster = Cluster.preset("2x8xV100")
    inside = cluster.link(cluster.device_names[0], cluster.device_names[7])
    across = cluster.link(cluster.device_names[0], cluster.device_names[8])
    assert inside.bandwidth == 25e9 and across.bandwidth == 12.5e9
    assert {d.host for d in cluster.devices} == {0, 1}


def test_json_round_trip(tmp_path):
    cluster = Cluster.preset("2x8xV100")
    cluster.save(tmp_path / "cluster.json")
    loaded = Cluster.load(tmp_path / "cluster.json")
    assert loaded.to_dict() == cluster.to_dict()
    assert Cluster.resolve(str(tmp_path / "cluster.json")).device_names == cluster.device_names


@pytest.mark.parametrize("build, message", [
    (lambda: Cluster.preset("3xTPU"), "Unknown cluster preset '3xTPU'.*kerasflow clusters"),
    (lambda: Cluster([]), "at least one device"),
    (lambda: Cluster([Device("/GPU:0", "V100", 1), Device("/GPU:0", "V100", 1)]), "appears twice"),
    (lambda: Device("/GPU:0", "V100", 0), "memory"),
    (lambda: Device("/GPU:0", "V100", 1, speed=-2), "speed"),
    (lambda: Cluster([Device("/GPU:0", "V100", 1)], Link(0, 0)), "bandwidth"),
    (lambda: Cluster([Device("/GPU:0", "V100", 1)]).device("/GPU:7"), r"'/GPU:7' is not in the cluster; it has \['/GPU:0'\]"),
    (lambda: Cluster([Device("/GPU:0", "V100", 1)], links={("/GPU:0", "/GPU:9"): Link(0, 1)}), "/GPU:9"),
    (lambda: Cluster.resolve(42), "preset name or a .json path"),
])
def test_bad_clusters_raise_one_clear_error(build, message):
    with pytest.raises(InvalidClusterError, match=message):
        build()


def test_bad_cluster_files(tmp_path):
    path = tmp_path / "cluster.json"
    data = Cluster.preset("2xK80-pcie").to_dict()
    data["devices"][0].pop("kind")
    path.write_text(json.dumps(data))
    with pytest.raises(FileFormatError, match="cluster.json' is invalid: Each device needs 'name', 'kind' and 'memory'"):
        Cluster.load(path)


def test_two_level_clusters_and_their_hosts():
    devices = [Device(f"/job:worker/replica:0/task:{h}/device:GPU:{i}", "V100", 2**34, host=h)
               for h in range(2) for i in range(2)]
    inside, network = Link(5e-6, 25e9), Link(25e-6, 12.5e9)
    cluster = Cluster.two_level(devices, inside, network, name="2x2")
    names = cluster.device_names
    assert cluster.link(names[0], names[1]) == inside and cluster.link(names[2], names[3]) == inside
    assert cluster.link(names[0], names[2]) == network and cluster.link(names[3], names[1]) == network
    assert cluster.hosts() == {0: names[:2], 1: names[2:]}
    preset = Cluster.preset("2x8xV100")
    assert [len(v) for v in preset.hosts().values()] == [8, 8]
    with pytest.raises(InvalidClusterError, match="inter_host"):
        Cluster.two_level(devices, inside, (1.0, -5))
