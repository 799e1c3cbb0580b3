"""The bundled benchmark programs (configs/programs) and the ``gensorage program`` CLI.

Paper-size programs are only parsed (shape inference); numerics run at small parameters against numpy
versions written here independently of the .gsp files.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from gensorage.cli import main
from gensorage.errors import ConfigError
from gensorage.opset import Op
from gensorage.program import Program, config_dir, dump_program, list_configs, load_config, parse_program

# Output shape of every attention config at its default (paper) parameters; each is bundled in the stable form
# (NAME) and in the papers' form (NAME_papers), with the same shapes.
_ATTENTION = {
    "mha_incdec": (32, 1, 128),
    "mha_specdec": (32, 32, 128),
    "mha_prefill": (32, 512, 128),
    "gqa_incdec": (16, 1, 128),
    "gqa_specdec": (16, 32, 128),
    "gqa_prefill": (16, 512, 128),
    "mqa_incdec": (71, 1, 64),
    "mqa_specdec": (71, 32, 64),
    "mqa_prefill": (71, 512, 64),
}
# Output shape of every config at its default (paper) parameters.
DEFAULT_OUTPUTS = {
    **_ATTENTION,
    **{f"{name}_papers": shape for name, shape in _ATTENTION.items()},
    "lora": (16, 4096),
    "gated_mlp": (8, 4096),
    "rmsnorm": (16, 4096),
    "qknorm": (2, 256, 64),
    "ntrans": (8, 4096),
    "mlp": (8, 4096),
    "moe": (8, 8, 4096),
}


def test_every_config_is_listed_and_known() -> None:
    assert sorted(p.stem for p in list_configs()) == sorted(DEFAULT_OUTPUTS)


@pytest.mark.parametrize("name", sorted(DEFAULT_OUTPUTS))
def test_config_parses_at_default_shapes(name: str) -> None:
    p = load_config(name)
    assert p.name == name
    assert [t.shape for t in p.outputs] == [DEFAULT_OUTPUTS[name]]
    assert all(t.dtype == "float16" for t in p.inputs)
    assert parse_program(dump_program(p)).key() == p.key()


def test_attention_defaults_follow_the_paper() -> None:
    # Mirage paper 000 §7.2: 4096 KV tokens; 1 / 32 / 512 query tokens. K as models keep it ([heads, keys, dim])
    # in the stable form, pre-transposed ([heads, dim, keys]) in the papers' form.
    for family in ("mha", "gqa", "mqa"):
        for mode, s in (("incdec", 1), ("specdec", 32), ("prefill", 512)):
            for form in ("", "_papers"):
                p = load_config(f"{family}_{mode}{form}")
                assert p.params["s"] == s and p.params["n"] == 4096
    gqa = load_config("gqa_incdec")
    assert [t.shape for t in gqa.inputs] == [(16, 1, 128), (2, 4096, 128), (2, 4096, 128)]
    mqa = load_config("mqa_incdec")
    assert [t.shape for t in mqa.inputs] == [(71, 1, 64), (1, 4096, 64), (1, 4096, 64)]
    gqa = load_config("gqa_incdec_papers")
    assert [t.shape for t in gqa.inputs] == [(16, 1, 128), (2, 128, 4096), (2, 4096, 128)]
    mqa = load_config("mqa_incdec_papers")
    assert [t.shape for t in mqa.inputs] == [(71, 1, 64), (1, 64, 4096), (1, 4096, 64)]


def test_stable_attention_subtracts_the_row_max_and_the_papers_form_does_not() -> None:
    for name in _ATTENTION:
        stable = Counter(n.op for n in load_config(name).nodes)
        papers = Counter(n.op for n in load_config(f"{name}_papers").nodes)
        assert stable[Op.MAX] == stable[Op.SUB] == stable[Op.TRANSPOSE] == 1
        assert papers[Op.MAX] == papers[Op.SUB] == papers[Op.TRANSPOSE] == 0
        assert stable[Op.EXP] == papers[Op.EXP] == 1


def test_stable_attention_is_sdpa_with_a_sink_logit_of_100() -> None:
    # The stable program means torch's SDPA with enable_gqa: softmax(Q Kᵀ/√d) V with query head i reading key/value
    # head i // g, written here in numpy float64 independently of the builder, with one key whose logit is >= 100.
    p = load_config("gqa_specdec", {"kv": 2, "g": 2, "s": 3, "n": 8, "d": 4})
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(t.shape) for t in p.inputs)
    q[:, :, :] = np.abs(q) + 1.0
    k[:, 3, :] = 0.0
    k[:, 3, 0] = 100.0 * 2.0 / q[:, :, 0].min()  # every query's logit for key 3 is at least 100
    kr, vr = np.repeat(k, 2, axis=0), np.repeat(v, 2, axis=0)
    s = q @ kr.transpose(0, 2, 1) / 2.0
    w = np.exp(s - s.max(axis=2, keepdims=True))
    want = (w / w.sum(axis=2, keepdims=True)) @ vr
    (got,) = p.run(q, k, v)
    assert s.max() >= 100.0 and np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_attention_modes_share_one_structure() -> None:
    for family in ("mha", "gqa", "mqa"):
        for form in ("", "_papers"):
            modes = ("incdec", "specdec", "prefill")
            keys = {load_config(f"{family}_{m}{form}").structure_key() for m in modes}
            assert len(keys) == 1
    for form in ("", "_papers"):
        small = load_config(f"gqa_incdec{form}", {"kv": 1, "g": 2, "n": 8, "d": 4})
        assert small.structure_key() == load_config(f"gqa_prefill{form}").structure_key()
        assert small.key() != load_config(f"gqa_incdec{form}").key()
    assert load_config("gqa_incdec").structure_key() != load_config("gqa_incdec_papers").structure_key()


def test_unknown_config_lists_available() -> None:
    with pytest.raises(ConfigError, match="available: gated_mlp, gqa_incdec"):
        load_config("nope")


def test_config_dir_env_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "programs").mkdir()
    (tmp_path / "programs" / "tiny.gsp").write_text("input X [2]\nY = exp(X)\noutput Y\n")
    monkeypatch.setenv("GENSORAGE_CONFIG_DIR", str(tmp_path))
    assert config_dir() == tmp_path / "programs"
    assert [p.stem for p in list_configs()] == ["tiny"]
    assert load_config("tiny").outputs[0].shape == (2,)


# ------------------------------------------------------------------ numerics at small shapes vs numpy


def _rand(p: Program, seed: int = 0) -> list[np.ndarray]:
    return p.random_inputs(seed)


def _softmax_rows(a: np.ndarray) -> np.ndarray:
    e = np.exp(a - a.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _attention(q: np.ndarray, k_t: np.ndarray, v: np.ndarray, kv_head_of: list[int]) -> np.ndarray:
    """Per query head i: softmax(q_i k_j / sqrt(d)) v_j with j = kv_head_of[i]; k_t is [heads, d, n]."""
    d = q.shape[-1]
    return np.stack([_softmax_rows(q[i] @ k_t[j] / np.sqrt(d)) @ v[j] for i, j in enumerate(kv_head_of)])


def _k_t(k: np.ndarray, form: str) -> np.ndarray:
    """K as [heads, d, n]: the papers' form is given so, the stable form keeps it as models do ([heads, n, d])."""
    return k if form == "_papers" else k.transpose(0, 2, 1)


FORMS = ["", "_papers"]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("mode", ["incdec", "specdec", "prefill"])
def test_mha_numerics(mode: str, form: str) -> None:
    p = load_config(f"mha_{mode}{form}", {"b": 2, "h": 3, "s": 5, "n": 7, "d": 4})
    q, k, v = _rand(p)
    assert q.shape == (6, 5, 4)
    want = _attention(q, _k_t(k, form), v, list(range(6)))
    np.testing.assert_allclose(p.run(q, k, v)[0], want, rtol=1e-10)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("mode", ["incdec", "specdec", "prefill"])
def test_gqa_numerics(mode: str, form: str) -> None:
    p = load_config(f"gqa_{mode}{form}", {"b": 2, "kv": 2, "g": 3, "s": 2, "n": 9, "d": 4})
    q, k, v = _rand(p, 1)
    assert q.shape == (12, 2, 4) and _k_t(k, form).shape == (4, 4, 9)
    # query head i (of 12 = 2 sequences x 2 kv heads x 3) reads kv head i // 3
    want = _attention(q, _k_t(k, form), v, [i // 3 for i in range(12)])
    np.testing.assert_allclose(p.run(q, k, v)[0], want, rtol=1e-10)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("mode", ["incdec", "specdec", "prefill"])
def test_mqa_numerics(mode: str, form: str) -> None:
    p = load_config(f"mqa_{mode}{form}", {"b": 2, "h": 3, "s": 2, "n": 6, "d": 8})
    q, k, v = _rand(p, 2)
    assert _k_t(k, form).shape == (2, 8, 6)
    want = _attention(q, _k_t(k, form), v, [i // 3 for i in range(6)])
    np.testing.assert_allclose(p.run(q, k, v)[0], want, rtol=1e-10)


def test_lora_numerics() -> None:
    p = load_config("lora", {"t": 3, "k": 5, "m": 6, "r": 2})
    x, w, a, b = _rand(p)
    # Paper form O = W X + B A X with X as columns, transposed back to rows.
    expected = (w.T @ x.T + b.T @ (a.T @ x.T)).T
    np.testing.assert_allclose(p.run(x, w, a, b)[0], expected, rtol=1e-10)
    assert [n.op for n in p.nodes if n.op is not None].count(Op.MATMUL) == 3


def test_gated_mlp_numerics() -> None:
    p = load_config("gated_mlp", {"t": 3, "k": 5, "f": 4})
    x, w1, w2 = _rand(p)
    h = x @ w1
    np.testing.assert_allclose(p.run(x, w1, w2)[0], h / (1 + np.exp(-h)) * (x @ w2), rtol=1e-10)


def test_rmsnorm_numerics() -> None:
    p = load_config("rmsnorm", {"b": 3, "h": 8, "d": 5})
    x, g, w = _rand(p)
    rms = np.sqrt(np.mean(x**2, axis=1, keepdims=True))
    np.testing.assert_allclose(p.run(x, g, w)[0], (x / rms * g) @ w, rtol=1e-10)


def test_qknorm_numerics() -> None:
    p = load_config("qknorm", {"b": 1, "h": 2, "s": 3, "n": 5, "d": 4})
    q, k, v = _rand(p)
    qn = q / np.sqrt(np.mean(q**2, axis=2, keepdims=True))
    kn = k / np.sqrt(np.mean(k**2, axis=1, keepdims=True))  # k is [h, d, n]: normalise over d
    np.testing.assert_allclose(p.run(q, k, v)[0], _attention(qn, kn, v, [0, 1]), rtol=1e-10)


def test_ntrans_numerics() -> None:
    p = load_config("ntrans", {"b": 3, "d": 6})
    h, x, alpha = _rand(p)

    def unit(a: np.ndarray) -> np.ndarray:
        return a / np.linalg.norm(a, axis=1, keepdims=True)

    np.testing.assert_allclose(p.run(h, x, alpha)[0], unit(x + alpha * (unit(h) - x)), rtol=1e-10)


def test_mlp_and_moe_numerics() -> None:
    mlp = load_config("mlp", {"t": 3, "k": 4, "f": 5})
    x, w1, w2 = _rand(mlp)
    np.testing.assert_allclose(mlp.run(x, w1, w2)[0], np.maximum(x @ w1, 0) @ w2, rtol=1e-10)
    moe = load_config("moe", {"e": 3, "t": 2, "k": 4, "f": 5})
    x, w1, w2 = _rand(moe)
    expected = []
    for e in range(3):
        h = x[e] @ w1[e]
        expected.append((h / (1 + np.exp(-h))) @ w2[e])
    np.testing.assert_allclose(moe.run(x, w1, w2)[0], np.stack(expected), rtol=1e-10)


# ------------------------------------------------------------------ CLI


def test_cli_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["program", "list"]) == 0
    out = capsys.readouterr().out
    assert len(out.strip().splitlines()) == len(DEFAULT_OUTPUTS)
    assert "gqa_incdec   Q[16, 1, 128]" in out


def test_cli_show_text_and_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    f = tmp_path / "p.gsp"
    f.write_text("param n = 4\ninput X [2, n]\nY = sum(exp(X), dim=1)\noutput Y\n")
    assert main(["program", "show", str(f), "--param", "n=3"]) == 0
    out = capsys.readouterr().out
    assert "input  X: [2, 3] float16" in out and "Y = sum(" in out and ": [2, 1] float16" in out
    assert main(["program", "show", "lora", "--json", "--param", "k=8"]) == 0

    data = json.loads(capsys.readouterr().out)
    assert data["name"] == "lora" and data["params"]["k"] == 8
    assert data["inputs"][0] == {"name": "X", "shape": [16, 8], "dtype": "float16"}
    assert data["outputs"] == ["O"] and data["nodes"][-1]["op"] == "add"


def test_cli_run_is_deterministic_and_correct(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    f = tmp_path / "p.gsp"
    f.write_text("input X [3, 4] float32\nY = scale(X, 2)\noutput Y\n")
    assert main(["program", "run", str(f), "--seed", "5"]) == 0
    first = capsys.readouterr().out
    assert main(["program", "run", str(f), "--seed", "5"]) == 0
    assert capsys.readouterr().out == first
    x = np.random.default_rng(5).standard_normal((3, 4))
    assert first.startswith(f"Y: shape [3, 4] sum {2 * x.sum():.12g} l2 {2 * np.linalg.norm(x):.12g}")


@pytest.mark.parametrize(
    ("argv", "code", "pattern"),
    [
        (["program", "show", "nope"], 6, "no program config 'nope'"),
        (["program", "show", "missing.gsp"], 6, "no such program file"),
        (["program", "show", "lora", "--param", "k"], 6, "expected NAME=VALUE"),
        (["program", "show", "lora", "--param", "k=x"], 6, "must be an integer"),
        (["program", "show", "lora", "--param", "zz=1"], 6, r"unknown parameter\(s\) zz"),
        (["program", "show", "lora", "--param", "k=0"], 6, "must be positive"),
        (["program", "run", "moe", "--max-elements", "1000"], 3, "over the limit of 1000"),
    ],
)
def test_cli_errors(argv: list[str], code: int, pattern: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == code
    err = capsys.readouterr().err
    assert err.startswith("gensorage: error: ") and len(err.strip().splitlines()) == 1

    assert re.search(pattern, err)
