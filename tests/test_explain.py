"""The explainer (attnlab/explain): its weights against every kernel's own output, each view's data against the
model it explains, its HTTP API's refusals, and the page in a real headless Chromium against a real `attnlab
explain` subprocess (typed prompt, heatmap cells read back from the page's data and compared with the model's
weights; the decode view gaining one row per streamed token; a shuffled prompt without positions giving the
permuted matrix). Screenshots go to this run's temporary folder, and to benchmarks/results when
ATTNLAB_SAVE_SCREENSHOTS is set."""
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch

from attnlab.config import ModelConfig, RunConfig
from attnlab.explain import capture, views
from attnlab.models import build_model

REPO = Path(__file__).resolve().parents[1]
PROMPT = "the cat sat on the mat, and the dog sat on the log."


def _model(**kw):
    torch.manual_seed(0)
    cfg = ModelConfig(dim=32, n_layers=2, n_heads=4, max_seq_len=128, **kw)
    return build_model(cfg).eval()


def _byte_explained(model):
    from attnlab.data.tokenizers import load_tokenizer

    return views.Explained(model, load_tokenizer("byte"), "tiny")


@pytest.mark.parametrize("kernel,extra", [("naive", {}), ("sdpa", {}), ("flash", {}), ("sliding", {"window": 5}),
                                          ("block_sparse", {"block_size": 4})])
@pytest.mark.parametrize("pos", ["rope", "alibi", "learned"])
def test_recomputed_weights_give_each_kernels_own_output(kernel, extra, pos):
    """weights @ v equals what the kernel returned, for every kernel and positional encoding (GQA included)."""
    model = _model(kernel=kernel, pos=pos, n_kv_heads=2, **extra)
    ids = list(range(40, 77))
    calls = capture.prompt_calls(model, ids)
    assert [c.layer for c in calls] == [0, 1]
    for c in calls:
        w = capture.weights(c)
        v = c.v.float().repeat_interleave(c.q.shape[1] // c.v.shape[1], dim=1)
        torch.testing.assert_close(w @ v, c.out.float(), atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]))
        assert float(w.triu(1).abs().max()) == 0.0  # causal: nothing after the query
    # the full-attention kernels' weights are the naive kernel's, on the same weights (the sliding and block-sparse
    # kernels mask their own patterns: checked above against their own outputs)
    naive = _model(kernel="naive", pos=pos, n_kv_heads=2)
    naive.load_state_dict(model.state_dict())
    if kernel in ("sdpa", "flash"):
        torch.testing.assert_close(capture.prompt_weights(model, ids), capture.prompt_weights(naive, ids),
                                   atol=2e-6, rtol=1e-5)
    # the recording is gone afterwards: the engine's checks for the plain sdpa kernel hold again
    from attnlab.models.attention import KERNELS
    assert all(m.kernel is KERNELS[kernel] for m in capture.attention_layers(model))


def test_order_without_positions_is_the_permuted_matrix():
    ex = _byte_explained(_model(pos="rope"))
    o = views.order(ex, PROMPT, seed=3)
    assert o["without_positions"]["max_abs_difference"] < 1e-5
    assert o["with_positions"]["max_abs_difference"] > 1e-3
    perm, a, b = o["perm"], o["without_positions"]["original"], o["without_positions"]["shuffled"]
    assert all(abs(b[i][j] - a[perm[i]][perm[j]]) < 1e-5 for i in range(len(perm)) for j in range(len(perm)))
    assert len(o["rope"]["mean_logit"]) == len(perm) and o["rope"]["cos_sum"][0] == pytest.approx(32 // 4 // 2)  # one cosine per frequency
    learned = views.order(_byte_explained(_model(pos="learned")), PROMPT, seed=3)
    assert learned["with_positions"]["max_abs_difference"] > 1e-3 and "rope" not in learned


def test_decode_rows_are_the_prefill_rows_of_the_same_text():
    """Each decode step's row (one query over the cached keys) equals that position's row of one pass over the
    whole text, and there is one event per token, the KV cache growing by one token each."""
    model = _model(pos="rope")
    ex = _byte_explained(model)
    events = list(views.decode_steps(ex, PROMPT, 6))
    first, steps = events[0], events[1:]
    assert first["phase"] == "prefill" and len(steps) == 6 and first["seconds"] > 0
    T = len(first["tokens"])
    assert [s["kv_tokens"] for s in steps] == list(range(T + 1, T + 7))
    assert all(s["seconds"] > 0 for s in steps) and steps[-1]["kv_blocks"] >= first["kv_blocks"] >= 1
    text = ex.encode(PROMPT) + [s["id"] for s in steps]
    full = capture.prompt_weights(model, text[:-1])  # the last token's row is never computed (nothing follows)
    for l in range(2):
        for h in range(4):
            torch.testing.assert_close(torch.tensor(first["weights"][l][h]), full[l, h, :T, :T], atol=1e-5, rtol=1e-4)
            for s in steps[:-1]:
                S = s["kv_tokens"]
                torch.testing.assert_close(torch.tensor(s["row"][l][h]), full[l, h, S - 1, :S], atol=1e-5, rtol=1e-4)


def test_budget_grid_and_attention_views():
    ex = _byte_explained(_model(pos="rope"))
    a = views.attention(ex, PROMPT, layer=1, head=2)
    T = len(a["tokens"])
    assert len(a["weights"]) == T and a["prefill"]["median_s"] > 0 and len(a["entropy_bits"]) == 2
    torch.testing.assert_close(torch.tensor(a["weights"]), capture.prompt_weights(ex.model, ex.encode(PROMPT))[1, 2],
                               atol=1e-5, rtol=1e-4)
    b = views.budget(ex, PROMPT)
    assert [p["tokens"] for p in b["by_prefix"]] == sorted(p["tokens"] for p in b["by_prefix"])
    rows = b["rows"]  # every row of the prompt: the first sees one key (entropy 0, all its weight on it)
    assert len(rows["entropy_bits"]) == 2 and len(rows["entropy_bits"][0]) == T
    assert rows["entropy_bits"][0][0] == pytest.approx(0, abs=1e-5) and rows["max_weight"][1][0] == pytest.approx(1)
    assert all(e <= u + 1e-6 for e, u in zip(rows["entropy_bits"][1], rows["uniform_bits"]))  # at most log2(i + 1)
    own = [p["weight_on_prompt"][0] for p in b["by_filler"]]
    assert own[0] == pytest.approx(1.0) and own[-1] < own[0]  # inserted text takes some of the budget
    g = views.grid(ex, (16, 32, 64), predict=lambda n: n * 1e-6)
    assert [r["score_cells"] for r in g["rows"]] == [n * (n + 1) // 2 * 2 * 4 for n in (16, 32, 64)]
    assert all(r["prefill"]["median_s"] > 0 and r["predicted_s"] == r["tokens"] * 1e-6 for r in g["rows"])
    with pytest.raises(Exception, match="layers 0..1"):
        views.attention(ex, PROMPT, layer=5)
    with pytest.raises(Exception, match="type a prompt"):
        views.attention(ex, "")
    with pytest.raises(Exception, match="shorten it"):
        views.attention(ex, "x" * 300)
    with pytest.raises(Exception, match="recurrence view needs"):
        views.recurrence(ex, PROMPT)


def test_the_attention_view_sends_the_kernels_own_mask():
    """The heatmap hatches what the kernel hides: the causal triangle for sdpa, and for the sliding window also the
    keys more than a window back (the page draws ``visible``; every hidden cell has weight 0)."""
    for kernel, extra in (("sdpa", {}), ("sliding", {"window": 5}), ("block_sparse", {"block_size": 4})):
        a = views.attention(_byte_explained(_model(pos="rope", kernel=kernel, **extra)), PROMPT)
        seen, w = torch.tensor(a["visible"], dtype=torch.bool), torch.tensor(a["weights"])
        T = len(a["tokens"])
        assert seen.shape == (T, T) and not seen.triu(1).any() and seen.diagonal().all()
        assert (w[~seen] == 0).all()
        if kernel == "sliding":
            i, j = torch.meshgrid(torch.arange(T), torch.arange(T), indexing="ij")
            assert torch.equal(seen, (j <= i) & (j > i - 5))
        if kernel == "sdpa":
            assert torch.equal(seen, torch.ones(T, T, dtype=torch.bool).tril())


@pytest.mark.parametrize("layout", ["gpt2", "llama"])
def test_views_on_a_hugging_face_folder(tmp_path, layout):
    """A Hugging Face GPT-2 or Llama folder (weights, config.json, tokenizer.json), opened as `attnlab explain`
    opens it: the attention view's weights are the loaded model's, and the decode view streams its rows."""
    from attnlab.data.tokenizers import BPETokenizer
    from attnlab.models.hf import save_hf
    from attnlab.resolve import load_model

    tok = BPETokenizer.train([PROMPT * 4, "def f(x):\n    return x + 1\n"], vocab_size=300)
    shape = (dict(pos="learned", mlp="gelu", norm="layernorm", bias=True) if layout == "gpt2" else
             dict(pos="rope", mlp="swiglu", norm="rmsnorm", n_kv_heads=2))
    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=tok.vocab_size, dim=32, n_layers=2, n_heads=4, max_seq_len=128,
                                    **shape)).eval()
    save_hf(model, tmp_path / layout, architecture=layout, tokenizer=tok)
    loaded = load_model(tmp_path / layout)
    assert loaded.kind == "hf" and loaded.tokenizer is not None
    ex = views.Explained(loaded.model, loaded.tokenizer, layout)
    a = views.attention(ex, PROMPT, layer=1, head=1)
    want = capture.prompt_weights(model, tok.encode(PROMPT))[1, 1]
    torch.testing.assert_close(torch.tensor(a["weights"]), want, atol=1e-5, rtol=1e-4)
    steps = list(views.decode_steps(ex, PROMPT, new_tokens=3))
    assert [s["phase"] for s in steps] == ["prefill", "decode", "decode", "decode"]


def test_recurrence_view_on_an_lstm():
    torch.manual_seed(0)
    model = build_model(ModelConfig(family="lstm", dim=32, n_layers=2, max_seq_len=128)).eval()
    ex = _byte_explained(model)
    r = views.recurrence(ex, PROMPT)
    T = len(r["tokens"])
    assert len(r["state_norm"]) == len(r["influence"]) == T and r["dependent_steps"] == 2 * T
    assert r["influence"][-1] > 0 and r["forward"]["median_s"] > 0
    with pytest.raises(Exception, match="no softmax attention"):
        views.attention(ex, PROMPT)


# --- the real server and the page -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A small model trained briefly on the embedded corpus (its heads have begun to specialise, so the pictures
    and the screenshots show a learned pattern, not an untrained model's uniform rows)."""
    from attnlab.checkpoint import save_checkpoint
    from attnlab.config import TrainConfig
    from attnlab.data.tasks import make_task
    from attnlab.fit import train_in_memory

    torch.manual_seed(0)
    model = build_model(ModelConfig(dim=48, n_layers=2, n_heads=4, max_seq_len=160))
    task = make_task(TrainConfig(seq_len=64, batch_size=16))
    train_in_memory(model, task.batch, TrainConfig(steps=200, lr=3e-3, warmup_steps=10))
    out = tmp_path_factory.mktemp("explain") / "demo-48x2"
    save_checkpoint(out, model, RunConfig(model=model.cfg))
    return out


@contextlib.contextmanager
def explain_server(folder: Path):
    """`attnlab explain FOLDER` in a subprocess on a free loopback port, waited for (/api/info); its URL."""
    from attnlab.serve.launch import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "attnlab", "explain", str(folder), "--port", str(port),
                             "--no-calibrate", "--threads", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            try:
                if httpx.get(url + "/api/info", timeout=2, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "attnlab explain did not start"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.fixture(scope="module")
def server(folder):
    with explain_server(folder) as url:
        yield url


def test_api_refuses_bad_input_with_its_reason(server):
    post = lambda path, **kw: httpx.post(server + path, timeout=30, trust_env=False, **kw)
    r = post("/api/attention", json={"prompt": ""})
    assert r.status_code == 400 and "prompt" in r.json()["error"]["message"]
    assert post("/api/attention", content=b"prompt=x", headers={"Content-Type": "text/plain"}).status_code == 415
    assert post("/api/attention", content=b"{", headers={"Content-Type": "application/json"}).status_code == 400
    assert post("/api/attention", json={"prompt": "hi", "layer": 9}).status_code == 400
    assert post("/api/attention", json={"prompt": "x" * 400}).json()["error"]["message"].endswith("shorten it")
    assert post("/api/recurrence", json={"prompt": "hi"}).status_code == 400
    assert post("/api/attention", json={"prompt": "x" * 70_000}).status_code == 413
    foreign = post("/api/attention", json={"prompt": "hi"}, headers={"Origin": "http://evil.example"})
    assert foreign.status_code == 403
    lines = post("/api/decode", json={"prompt": "hello there", "new_tokens": 3}).text.strip().splitlines()
    assert [json.loads(x)["phase"] for x in lines] == ["prefill", "decode", "decode", "decode"]


@pytest.fixture(scope="module")
def page(server, tmp_path_factory):
    from cdp import open_page
    from serving import chromium

    path = chromium()
    if path is None:
        pytest.skip("chromium not installed (apt-get install chromium)")
    with open_page(path, tmp_path_factory.mktemp("chromium")) as tab:
        yield tab


def _open(page, server):
    page.events.clear()
    page.call("Page.navigate", url=server + "/")
    page.wait("document.readyState === 'complete' && document.body.dataset.ready === '1'", "the page to load")


def _screenshot(page, tmp_path_factory, name: str) -> None:
    shots = tmp_path_factory.getbasetemp() / "screenshots"
    shots.mkdir(exist_ok=True)
    page.screenshot(shots / name)
    assert (shots / name).stat().st_size > 10_000
    if os.environ.get("ATTNLAB_SAVE_SCREENSHOTS"):
        shutil.copy(shots / name, REPO / "benchmarks" / "results" / name)


def test_page_shows_the_models_own_weights_decode_rows_and_order(page, server, folder, tmp_path_factory):
    from attnlab.resolve import load_model

    _open(page, server)
    prompt = "attention reads every token at once"
    page.type("#prompt", prompt)
    page.js("document.querySelector('#head').value = '0'")
    page.click("#run")
    page.wait("window.explain.attention && window.explain.attention.tokens.length > 0", "the attention view", timeout_s=120)
    got = page.js("window.explain.attention")
    loaded = load_model(folder)
    want = capture.prompt_weights(loaded.model.eval(), loaded.tokenizer.encode(prompt))
    assert got["tokens"] == [chr(b) for b in prompt.encode()]
    torch.testing.assert_close(torch.tensor(got["weights"]), want[got["layer"], got["head"]], atol=1e-5, rtol=1e-4)
    assert page.js("getComputedStyle(document.querySelector('#pages')).display") == "none"  # no server page here
    page.js("document.querySelector('#tokens button:nth-child(4)').focus()")  # keyboard focus on a token
    assert "attends most to" in page.text("#focus-text")
    assert page.js("document.querySelectorAll('#attention-table tbody tr').length") == len(prompt)
    _screenshot(page, tmp_path_factory, "explain_desktop.png")

    page.click("#tab-budget")
    page.click("#budget-run")
    page.wait("window.explain.budget && !document.querySelector('#budget-run').disabled", "the budget view", timeout_s=120)
    assert page.js("document.querySelectorAll('#budget-chart polyline').length") >= 2
    assert page.js("document.querySelectorAll('#rows-table tbody tr').length") == len(prompt)
    _screenshot(page, tmp_path_factory, "explain_desktop_budget.png")
    page.click("#tab-grid")
    page.click("#grid-run")
    page.wait("window.explain.grid && !document.querySelector('#grid-run').disabled", "the grid view", timeout_s=120)
    assert [r["tokens"] for r in page.js("window.explain.grid.rows")] == [16, 32, 64, 128]  # context 160
    # started with --no-calibrate: measurements only, and the page says why the prediction is missing
    assert all(r["predicted_s"] is None for r in page.js("window.explain.grid.rows"))
    assert "once this machine is measured" in page.text("#grid-note")
    _screenshot(page, tmp_path_factory, "explain_desktop_grid.png")

    page.click("#tab-decode")
    page.type("#new-tokens", "5")
    page.click("#decode-run")
    page.wait("window.explain.decode && window.explain.decode.steps.length === 5 && "
              "!document.querySelector('#decode-run').disabled", "five decode rows", timeout_s=120)
    d = page.js("window.explain.decode")
    assert [len(r[0][0]) for r in d["rows"]] == [len(prompt) + i for i in range(1, 6)]  # one key more each step
    assert d["drawn"] == [len(prompt) + i for i in range(6)]  # the grid redrawn as each event streamed in, a row more
    assert page.js("document.querySelectorAll('#decode-weights tbody tr').length") == len(prompt) + 5
    assert "KV cache:" in page.text("#kv-text")
    _screenshot(page, tmp_path_factory, "explain_desktop_decode.png")
    assert page.js("document.querySelectorAll('#decode-table tbody tr').length") == 6

    page.click("#tab-order")
    page.click("#order-run")
    page.wait("window.explain.order && !document.querySelector('#order-run').disabled", "the order view", timeout_s=120)
    o = page.js("window.explain.order")
    perm, a, b = o["perm"], o["without_positions"]["original"], o["without_positions"]["shuffled"]
    assert max(abs(b[i][j] - a[perm[i]][perm[j]]) for i in range(len(perm)) for j in range(len(perm))) < 1e-5
    assert o["with_positions"]["max_abs_difference"] > 1e-3
    assert page.js("document.querySelectorAll('#order-tables table').length") == 4  # each grid's text alternative
    _screenshot(page, tmp_path_factory, "explain_desktop_order.png")
    assert not page.errors()


def test_page_at_phone_width_fits_and_every_field_is_labelled(page, server, tmp_path_factory):
    """At 390 px every view, filled with its data, fits the screen (wide tables scroll inside their box); every
    field has a label."""
    page.viewport(390, 844, True)
    try:
        _open(page, server)
        page.click("#run")
        page.wait("window.explain.attention", "the attention view", timeout_s=120)
        assert page.js("document.documentElement.scrollWidth") <= 390
        unlabelled = page.js("[...document.querySelectorAll('input, select, textarea')].filter(e => !e.labels || "
                             "!e.labels.length).map(e => e.id)")
        assert unlabelled == []
        _screenshot(page, tmp_path_factory, "explain_phone.png")
        for view, button, ready in (("budget", "#budget-run", "window.explain.budget"),
                                    ("decode", "#decode-run", "window.explain.decode && window.explain.decode.steps.length"),
                                    ("grid", "#grid-run", "window.explain.grid"),
                                    ("order", "#order-run", "window.explain.order")):
            page.js(f"document.querySelector('#tab-{view}').click(); document.querySelector('{button}').click()")
            page.wait(f"{ready} && !document.querySelector('{button}').disabled", f"the {view} view", timeout_s=120)
            width = page.js("document.documentElement.scrollWidth")
            assert width <= 390, f"the {view} view is {width} px wide at 390"
            _screenshot(page, tmp_path_factory, f"explain_phone_{view}.png")
        assert not page.errors()
    finally:
        page.viewport(1280, 900, False)


def test_serve_has_the_views_as_a_tab_behind_its_key(tmp_path):
    """`attnlab serve`'s /explain: the page, the views on a copy of the served model (its completions unchanged
    around a recorded pass), the API key required as on every /api route."""
    from serving import Server, make_tiny_folder

    folder = make_tiny_folder(tmp_path / "serve-tiny", n_files=3)
    key = "tab-key"
    auth = {"Authorization": f"Bearer {key}"}
    with Server(folder, "--api-key", key) as s:
        assert "attnlab explain" in httpx.get(s.url + "/explain/", trust_env=False).text
        assert 'href="explain/"' in httpx.get(s.url + "/", trust_env=False).text
        body = {"prompt": "def f(x):", "max_tokens": 8, "temperature": 0}
        before = httpx.post(s.url + "/v1/completions", json=body, headers=auth, timeout=60).json()
        assert httpx.post(s.url + "/explain/api/attention", json={"prompt": "def f(x):"}, timeout=60,
                          trust_env=False).status_code == 401
        a = httpx.post(s.url + "/explain/api/attention", json={"prompt": "def f(x):"}, headers=auth, timeout=60,
                       trust_env=False).json()
        assert len(a["weights"]) == len(a["tokens"]) >= 2 and a["layers"] == 2
        after = httpx.post(s.url + "/v1/completions", json=body, headers=auth, timeout=60).json()
        assert after["choices"][0]["text"] == before["choices"][0]["text"]


def test_every_claim_links_to_a_view_of_the_explainer():
    """The report names, for each claim, the explainer's view that shows it; every such view is a tab of the page,
    and the rendered report carries the link."""
    import re

    from attnlab.experiments import registry
    from attnlab.report import EXPLAIN_VIEWS, render

    html = (REPO / "attnlab" / "explain" / "static" / "explain.html").read_text()
    tabs = set(re.findall(r'id="tab-([a-z]+)"', html))
    slugs = {e.slug for e in registry().values()}
    assert slugs == set(EXPLAIN_VIEWS) and {v for v, _ in EXPLAIN_VIEWS.values()} <= tabs
    results = json.loads((REPO / "reports" / "cpu-full" / "results.json").read_text())
    page = render(results)
    assert page.count("attnlab explain YOUR_CHECKPOINT") == len(results["claims"])
    assert '<a href="http://127.0.0.1:8001/#budget">its budget view</a>' in page  # a link: nothing fetched on load


def test_page_traces_a_recurrent_checkpoint(tmp_path):
    """An LSTM checkpoint opens on the recurrence view, which draws its chain and fills its table."""
    from attnlab.checkpoint import save_checkpoint
    from cdp import open_page
    from serving import chromium

    browser = chromium()
    if browser is None:
        pytest.skip("chromium not installed (apt-get install chromium)")
    torch.manual_seed(0)
    model = build_model(ModelConfig(family="lstm", dim=32, n_layers=2, max_seq_len=128))
    save_checkpoint(tmp_path / "lstm", model, RunConfig(model=model.cfg))
    with explain_server(tmp_path / "lstm") as url, open_page(browser, tmp_path) as page:
        _open(page, url)
        assert page.js("document.querySelector('#tab-recurrence').getAttribute('aria-selected')") == "true"
        page.click("#run")
        page.wait("window.explain.recurrence", "the recurrence view", timeout_s=120)
        n = len(page.js("window.explain.recurrence.tokens"))
        assert page.js("document.querySelectorAll('#rec-table tbody tr').length") == n
        assert page.js("document.querySelectorAll('#rec-chart polyline').length") == 3
        assert not page.errors()
        refused = httpx.post(url + "/api/attention", json={"prompt": "hi"}, timeout=30, trust_env=False)
        assert refused.status_code == 400 and "recurrence view" in refused.json()["error"]["message"]
