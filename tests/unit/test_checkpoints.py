"""One checkpoint mechanism (dreamshard.learning.checkpoints): every model round-trips; a checkpoint
that no longer matches the code is a clear error, never a silently different model."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from dreamshard.errors import DataFormatError
from dreamshard.learning import cost_model
from dreamshard.learning.checkpoints import load_checkpoint, save_checkpoint
from dreamshard.learning.cost_model import CostNetConfig, load_cost_net, save_cost_net
from dreamshard.learning.features import NUM_FEATURES, FeatureScaler
from dreamshard.learning.neuroshard import CommNetConfig, NeuroShardModel
from dreamshard.learning.policy import LearnedModel, PolicyNetConfig


def scaler() -> FeatureScaler:
    return FeatureScaler.fit(np.abs(np.random.default_rng(0).normal(size=(32, NUM_FEATURES))) * 10)


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_every_model_round_trips(tmp_path):
    gen = torch.Generator().manual_seed(0)
    net = CostNetConfig(hidden=16, embed=8, head_hidden=8, scale_ms=2.5, plan_estimate="head").build(gen)
    save_cost_net(net, scaler(), tmp_path / "cost.pt")
    loaded, sc = load_cost_net(tmp_path / "cost.pt")
    assert loaded.config == net.config and same_weights(loaded, net) and sc == scaler()

    model = LearnedModel(net, PolicyNetConfig(hidden=16, embed=8, head_hidden=8).build(gen), scaler(), {"a": 1})
    model.save(tmp_path / "policy.pt")
    back = LearnedModel.load(tmp_path / "policy.pt")
    assert back.meta == {"a": 1} and back.policy.config == model.policy.config
    assert same_weights(back.policy, model.policy) and same_weights(back.cost_net, model.cost_net)

    neuro = NeuroShardModel(net, CommNetConfig(hidden=(8, 4), scale_ms=0.5).build(gen), scaler(), {})
    neuro.save(tmp_path / "neuro.pt")
    again = NeuroShardModel.load(tmp_path / "neuro.pt")
    assert again.comm.config == CommNetConfig(hidden=(8, 4), scale_ms=0.5) and same_weights(again.comm, neuro.comm)
    # the same checkpoint saved twice is the same bytes (DVC sees an unchanged output, the evaluate journal's
    # fingerprint an unchanged model)
    neuro.save(tmp_path / "neuro2.pt")
    assert (tmp_path / "neuro.pt").read_bytes() == (tmp_path / "neuro2.pt").read_bytes()


def test_the_generator_decides_the_initial_weights_not_the_global_rng():
    state = torch.random.get_rng_state()
    a = CostNetConfig().build(torch.Generator().manual_seed(3))
    assert torch.equal(torch.random.get_rng_state(), state), "building a network drew from the global RNG"
    torch.manual_seed(12345)
    b = CostNetConfig().build(torch.Generator().manual_seed(3))
    assert same_weights(a, b)
    assert not same_weights(a, CostNetConfig().build(torch.Generator().manual_seed(4)))


def test_a_config_field_added_to_the_code_fails_loading_old_checkpoints(tmp_path, monkeypatch):
    """A new constructor argument (here `dropout`, with a default) cannot silently load an old checkpoint."""
    save_cost_net(CostNetConfig().build(torch.Generator()), scaler(), tmp_path / "old.pt")

    @dataclasses.dataclass(frozen=True)
    class CostNetConfigWithDropout(CostNetConfig):
        dropout: float = 0.1

    CostNetConfigWithDropout.__name__ = "CostNetConfig"
    monkeypatch.setattr(cost_model, "CostNetConfig", CostNetConfigWithDropout)
    lacks = r"old\.pt: network 'cost_net': the checkpoint lacks CostNetConfig field\(s\) dropout"
    with pytest.raises(DataFormatError, match=lacks):
        load_cost_net(tmp_path / "old.pt")


def tampered(tmp_path, change) -> str:
    path = tmp_path / "tampered.pt"
    save_cost_net(CostNetConfig(hidden=16).build(torch.Generator()), scaler(), path)
    state = torch.load(path, weights_only=True)
    change(state["networks"]["cost_net"])
    torch.save(state, path)
    return str(path)


def test_a_field_the_code_no_longer_has_is_an_error(tmp_path):
    path = tampered(tmp_path, lambda net: net["config"].update(width=3))
    with pytest.raises(DataFormatError, match=r"network 'cost_net': CostNetConfig has no field\(s\) width"):
        load_cost_net(path)


def test_weights_of_another_shape_are_an_error(tmp_path):
    path = tampered(tmp_path, lambda net: net["config"].update(hidden=32))
    with pytest.raises(DataFormatError, match=r"network 'cost_net': cannot rebuild it from its CostNetConfig"):
        load_cost_net(path)


def test_kind_format_and_missing_files(tmp_path):
    save_cost_net(CostNetConfig().build(torch.Generator()), scaler(), tmp_path / "cost.pt")
    with pytest.raises(DataFormatError, match="expected a 'policy' checkpoint, found a 'cost_net' one"):
        LearnedModel.load(tmp_path / "cost.pt")
    torch.save({"format": "dreamshard-model/1"}, tmp_path / "v1.pt")
    with pytest.raises(DataFormatError, match="expected a dreamshard-checkpoint/2 checkpoint, found 'dreamshard-model/1'"):
        load_checkpoint(tmp_path / "v1.pt", "policy")
    with pytest.raises(DataFormatError, match="no such model checkpoint"):
        load_cost_net(tmp_path / "absent.pt")
    with pytest.raises(ValueError, match="holds networks"):
        save_checkpoint(tmp_path / "x.pt", "neuroshard", {"compute": CostNetConfig().build(torch.Generator())},
                        scaler(), {})
    assert not (tmp_path / "x.pt").exists()


def test_the_cost_network_keeps_one_topology_and_reads_checkpoints_that_kept_its_fields_flat(tmp_path):
    from dreamshard.hardware.topology import Topology

    links = Topology(devices_per_host=4, intra_host_gbps=100.0, inter_host_gbps=5.0, latency_us=20.0)
    net = CostNetConfig(comm="model", batch_size=1024, topology=links).build(torch.Generator().manual_seed(0))
    save_cost_net(net, scaler(), tmp_path / "cost.pt")
    state = torch.load(tmp_path / "cost.pt", weights_only=True)
    stored = state["networks"]["cost_net"]["config"]
    assert stored["topology"] == dataclasses.asdict(links)  # the topology's own fields, nested: one definition
    assert load_cost_net(tmp_path / "cost.pt")[0].config.topology == links
    # as checkpoints stored it before: the topology's fields beside the others
    from dreamshard.learning.cost_model import LEGACY_TOPOLOGY_FIELDS

    state["networks"]["cost_net"]["config"] = {**{k: v for k, v in stored.items() if k != "topology"},
                                               **{k: getattr(links, k) for k in LEGACY_TOPOLOGY_FIELDS}}
    torch.save(state, tmp_path / "old.pt")
    old, _ = load_cost_net(tmp_path / "old.pt")
    assert old.config == net.config and same_weights(old, net)
    state["networks"]["cost_net"]["config"] = {**stored, "topology": {**stored["topology"], "hops": 2}}
    torch.save(state, tmp_path / "bad.pt")
    with pytest.raises(DataFormatError, match="cannot rebuild it from its CostNetConfig"):
        load_cost_net(tmp_path / "bad.pt")


def test_a_cost_network_by_lookup_group_round_trips_and_older_checkpoints_read_as_one_fused_sum(tmp_path):
    net = CostNetConfig(lookup_groups="kind").build(torch.Generator().manual_seed(0))
    save_cost_net(net, scaler(), tmp_path / "kind.pt")
    again, _ = load_cost_net(tmp_path / "kind.pt")
    assert again.config.lookup_groups == "kind" and same_weights(again, net)
    state = torch.load(tmp_path / "kind.pt", weights_only=True)
    # written before lookup groups: no such field, and a device's pieces summed as one operator
    del state["networks"]["cost_net"]["config"]["lookup_groups"]
    torch.save(state, tmp_path / "old.pt")
    assert load_cost_net(tmp_path / "old.pt")[0].config.lookup_groups == "device"
    with pytest.raises(ValueError, match="lookup_groups: expected one of"):
        CostNetConfig(lookup_groups="kinds")
