"""Block paths, the block an op of a traced graph belongs to, and keep_float32's selectors
(mxfp16/casting/selectors.py): exact paths and owners, and the refusals of selectors that match
nothing, match other blocks as a path than as a name, select the network itself, or are of no
kind."""
import json

import mxnet as mx
import pytest
from mxnet import gluon
from mxnet.gluon import nn

import mxfp16
from mxfp16.casting.selectors import BlockIndex, block_paths, select_blocks


class Attention(nn.HybridBlock):
    """Scores without the 1/sqrt(d): the block the issue's planted overflow sits in."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.query = nn.Dense(4, flatten=False)
            self.key = nn.Dense(4, flatten=False)

    def hybrid_forward(self, F, x):
        return F.softmax(F.batch_dot(self.query(x), self.key(x), transpose_b=True))


class Net(nn.HybridBlock):
    """Attention made in the network's name_scope and added to a HybridSequential: its prefix
    is the network's, not the sequence's."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.enc = nn.HybridSequential()
            self.enc.add(Attention(), nn.Dense(3, flatten=False))
            self.out = nn.Dense(2)

    def hybrid_forward(self, F, x):
        return self.out(F.relu(self.enc(x)))


@pytest.fixture
def net():
    net = Net(prefix="net_")
    net.initialize()
    return net


def test_paths_are_the_children_names_in_preorder(net):
    assert list(block_paths(net)) == ["enc", "enc.0", "enc.0.query", "enc.0.key", "enc.1", "out"]
    assert block_paths(net)["enc.0.key"] is net.enc[0].key


def test_every_op_of_the_traced_graph_belongs_to_its_innermost_block(net):
    index = BlockIndex(net)
    nodes = json.loads(net(mx.sym.var("data")).tojson())["nodes"]
    owners = {node["name"]: index.owner(node["name"]) for node in nodes if node["op"] != "null"}
    assert owners == {"net_attention0_dense0_fwd": "enc.0.query",
                      "net_attention0_dense1_fwd": "enc.0.key",
                      "net_attention0_batch_dot0": "enc.0", "net_attention0_softmax0": "enc.0",
                      "net_dense0_fwd": "enc.1", "net_relu0": "", "net_dense1_fwd": "out"}
    assert index.owner("data") == "" and index.owner("net_dense1_weight") == "out"
    assert index.subtree("enc.0") == ["enc.0", "enc.0.query", "enc.0.key"]


def test_a_cast_network_is_named_by_its_float32_blocks(net):
    cast = mxfp16.cast_block(net, "float16", emulate=False)
    index = BlockIndex(cast)
    assert list(index.paths) == list(block_paths(net))
    assert index.owner("net_attention0_batch_dot0") == "enc.0"
    assert select_blocks(cast, [net.out]) == {"net_dense1": ["out"]}


def test_a_plain_block_cast_in_place_keeps_its_paths():
    class Plain(gluon.Block):
        def __init__(self):
            super().__init__(prefix="plain_")
            with self.name_scope():
                self.body = nn.HybridSequential()
                self.body.add(nn.Dense(4, in_units=3), nn.Dense(2, in_units=4))

        def forward(self, x):
            return self.body(x) * 2

    plain = Plain()
    plain.initialize()
    mxfp16.cast_block(plain, "float16", emulate=False)
    assert list(block_paths(plain)) == ["body", "body.0", "body.1"]
    assert select_blocks(plain, ["body.1", nn.Dense]) == {"body.1": ["body.1"],
                                                         "Dense": ["body.0", "body.1"]}


def test_each_kind_of_selector(net):
    assert select_blocks(net, [net.enc[0], Attention, "enc.*.key", "net_dense0", "enc.?"]) == {
        "net_attention0": ["enc.0"], "Attention": ["enc.0"], "enc.*.key": ["enc.0.key"],
        "net_dense0": ["enc.1"], "enc.?": ["enc.0", "enc.1"]}
    assert select_blocks(net, "out") == {"out": ["out"]}


def test_a_selector_matching_nothing_names_the_nearest_paths(net):
    with pytest.raises(ValueError, match=r"^keep_float32 selector 'enc.0.querry' matches no block: "
                       r"the nearest block paths and names are 'enc.0.query', 'enc.0.key', "
                       r"'enc.0'; print\(net\) shows the paths$"):
        select_blocks(net, ["out", "enc.0.querry"])
    with pytest.raises(ValueError, match="selector 'Conv2D' matches no block"):
        select_blocks(net, nn.Conv2D)
    with pytest.raises(ValueError, match="selector 'dense7' matches no block"):
        select_blocks(net, nn.Dense(2, prefix="dense7_"))


def test_a_string_matching_other_blocks_as_path_and_as_name_is_refused():
    class Confusing(nn.HybridBlock):
        def __init__(self):
            super().__init__(prefix="c_")
            with self.name_scope():
                self.dense1 = nn.Dense(2)  # Gluon name c_dense0
                self.dense0 = nn.Dense(2)  # Gluon name c_dense1

        def hybrid_forward(self, F, x):
            return self.dense0(self.dense1(x))

    net = Confusing()
    assert select_blocks(net, "dense0") == {"dense0": ["dense0"]}  # a path only
    with pytest.raises(ValueError, match=r"^keep_float32 selector '\*dense0' matches the block "
                       r"path\(s\) \['dense0'\] and the Gluon name\(s\) of \['dense1'\], which are "
                       r"other blocks: select one of them by its path"):
        select_blocks(net, "*dense0")
    assert select_blocks(net, "*dense*") == {"*dense*": ["dense1", "dense0"]}  # the same blocks


def test_the_network_itself_and_other_kinds_are_refused(net):
    with pytest.raises(ValueError, match=r"selects the network itself: cast_block\(net, 'float32'\)"):
        select_blocks(net, net)
    with pytest.raises(TypeError, match=r"selector 3 \(int\): give a Block of the network, a Block "
                       "subclass, or a string"):
        select_blocks(net, [3])
    with pytest.raises(TypeError, match="selector <class 'int'>"):
        select_blocks(net, int)
