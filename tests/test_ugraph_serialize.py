"""µGraph JSON round trip and errors, the text form, and DOT output."""

from __future__ import annotations

import copy
import json
import shutil
from typing import Any

import pytest

from gensorage.errors import UGraphError
from gensorage.ugraph import KernelGraph, from_program
from gensorage.ugraph.dot import render, to_dot
from gensorage.ugraph.examples import EXAMPLES, gqa, rmsnorm_matmul
from gensorage.ugraph.serialize import from_json, to_json
from gensorage.ugraph.text import to_text


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_json_round_trip(name: str) -> None:
    p, g = EXAMPLES[name]()
    text = json.dumps(to_json(g))
    back = KernelGraph.from_json(json.loads(text))
    assert back == g and hash(back) == hash(g)
    assert json.dumps(back.to_json()) == text
    direct = from_program(p)
    assert from_json(json.loads(json.dumps(direct.to_json()))) == direct


def test_json_header() -> None:
    d = to_json(rmsnorm_matmul()[1])
    assert d["format"] == "gensorage.ugraph" and d["version"] == 1
    assert d["ops"][0]["block"]["nodes"][0] == {"kind": "iterator", "input": 0, "imap": [None], "fmap": 1}


def _broken(mutate: Any) -> dict[str, Any]:
    d = copy.deepcopy(to_json(gqa()[1]))
    mutate(d)
    return d


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d.update(format="other"), "format"),
        (lambda d: d.update(version=2), "version"),
        (lambda d: d.pop("ops"), "ops: missing"),
        (lambda d: d["inputs"][1].update(shape=[2, "x"]), "inputs[1].shape[1]"),
        (lambda d: d["inputs"][0].pop("dtype"), "inputs[0].dtype: missing"),
        (lambda d: d["ops"][0]["block"]["nodes"][1].update(imap=[0, 1.5]), "ops[0].block.nodes[1].imap[1]"),
        (lambda d: d["ops"][0]["block"]["nodes"][3].update(op="layer_norm"), "ops[0].block.nodes[3].op"),
        (lambda d: d["ops"][0]["block"]["nodes"][3].update(kind="loop"), "ops[0].block.nodes[3].kind"),
        (lambda d: d["ops"][0]["block"]["nodes"][8].update(accum="min"), "ops[0].block.nodes[8].accum"),
        (lambda d: d["ops"][0]["block"].update(forloop="2"), "ops[0].block.forloop"),
        (lambda d: d["ops"][1]["inputs"][0].append(0), "ops[1].inputs[0]"),
        (
            lambda d: d["ops"][0]["block"]["nodes"][5]["ops"][0].update(attrs={"factor": {"a": 1}}),
            "ops[0].block.nodes[5].ops[0].attrs.factor",
        ),
        (lambda d: d.update(outputs=[[True, 0]]), "outputs[0][0]"),
        (lambda d: d["ops"].append("matmul"), "ops[2]: expected an object"),
    ],
)
def test_malformed_json_names_the_field(mutate: Any, field: str) -> None:
    with pytest.raises(UGraphError) as e:
        from_json(_broken(mutate))
    assert field in str(e.value)


def test_malformed_top_level() -> None:
    with pytest.raises(UGraphError, match="expected an object"):
        from_json([1, 2])


def test_text_form_shows_structure() -> None:
    text = to_text(gqa()[1])
    assert text == str(gqa()[1])
    lines = text.splitlines()
    assert lines[0] == "µGraph: 3 inputs, 2 kernel ops"
    assert "  %0 = input Q: [8, 1, 8] float16" in lines
    # The split-KV partials (an exp-weighted sum and a sum of exps) are stored in float32.
    assert "  %3 = graph-defined(%0, %1, %2) -> [2, 4, 3, 8] float32, [2, 4, 3, 1] float32" in lines
    assert "      block graph: grid (x=2, y=3), forloop 2" in lines
    assert any("iterator(in1 %1) imap {x<->0, y<->2} fmap {i<->2}: [1, 8, 4]  [loop]" in ln for ln in lines)
    assert any("accumulator(#7, sum) fmap {i<->φ}: [1, 4, 8]" in ln for ln in lines)
    assert any("saver(#10) omap {x<->0, y<->2} -> [2, 4, 3, 8]" in ln for ln in lines)
    assert "  %4 = graph-defined(%3.0, %3.1) -> [8, 1, 8] float16" in lines
    assert lines[-1] == "  output %4"


def test_text_of_invalid_graph_still_prints() -> None:
    _, g = rmsnorm_matmul()
    d = to_json(g)
    d["ops"][0]["block"]["grid"] = [5]
    text = to_text(from_json(d))
    assert (
        "(invalid: kernel op %3 (graph-defined), block node #2 (iterator): imap x->1 does not divide" in text
    )


def test_dot_has_clusters_and_edges() -> None:
    dot = to_dot(gqa()[1])
    assert dot.startswith("digraph ugraph {") and dot.rstrip().endswith("}")
    assert dot.count("subgraph cluster_k3 {") == 1 and dot.count("subgraph cluster_k4 {") == 1
    assert "subgraph cluster_k3_b5 {" in dot  # the thread graph inside block graph 1
    assert 'label="%3 block graph: grid 2x3, forloop 2"' in dot
    assert "k1 -> k3_b1;" in dot  # kernel input K feeds its iterator
    assert "k3_b5_t1 -> k3_b6;" in dot  # thread graph output feeds the sum
    assert 'k3_b12 -> k3 [style=dashed, label="out 0"];' in dot
    assert "k3 -> k4_b0;" in dot
    assert "\\n" in dot and "\n\n" not in dot  # multi-line labels use DOT escapes
    assert dot.count("{") == dot.count("}")


def test_render_when_graphviz_present(tmp_path: Any) -> None:
    out = render(to_dot(rmsnorm_matmul()[1]), tmp_path / "g.svg")
    if shutil.which("dot") is None:
        assert out is None
    else:
        assert out is not None and out.read_text().lstrip().startswith("<")
