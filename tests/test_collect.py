"""`placer collect`: real checkpoints of all five architectures over real text and random ids.

The central check: every recorded selection equals an independent recomputation of the
router, token by token, from the router's own weights applied to that token's hidden state
(numpy float64; DeepSeek's sigmoid scores + e_score_correction_bias + group-limited top-k),
with each sequence run alone (no padding) - so batching, padding and the (batch, position) to
row mapping of the capture are all checked too.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cli_errors import assert_one_line_error
from mixed_corpus import rendered_record, write_mixed_corpus

from placer.checkpoint.tiny import ARCHITECTURES

pytest_plugins = ["fixtures_models"]  # the trace_models and collected fixtures

MARGIN = 1e-4  # near-ties closer than this may flip between batched and unbatched float32


def _read(trace_dir: Path) -> dict:
    tables = [pq.read_table(f) for f in sorted(trace_dir.glob("*.parquet"))]
    table = pa.concat_tables(tables)
    return {name: table.column(name).to_pylist() for name in table.column_names}


def _by_token(rows: dict) -> dict[tuple[int, int], dict]:
    """{(seq_id, pos): {"token", "phase", "tag", "layers": {layer: (experts, weights)}}}."""
    out: dict[tuple[int, int], dict] = {}
    for i in range(len(rows["seq_id"])):
        entry = out.setdefault((rows["seq_id"][i], rows["pos"][i]), {
            "token": rows["token"][i], "phase": rows["phase"][i], "tag": rows["tag"][i],
            "layers": {}})
        assert rows["layer"][i] not in entry["layers"], "a (token, layer) was recorded twice"
        entry["layers"][rows["layer"][i]] = (rows["experts"][i], rows["weights"][i])
    return out


def _reference(arch: str, router, hidden: np.ndarray, config) -> tuple[list, list, np.ndarray]:
    """Independent top-k: per row of `hidden` [N, H], (sorted experts, their weights, margin
    between the k-th and (k+1)-th choice score)."""
    weight = router.weight.detach().double().numpy()
    k = config.num_experts_per_tok
    x = hidden.astype(np.float64)
    if arch == "gpt_oss":
        logits = x @ weight.T + router.bias.detach().double().numpy()
        choice = logits
    else:
        logits = x @ weight.T
    if arch in ("qwen3_moe", "olmoe", "mixtral"):
        probs = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs /= probs.sum(axis=1, keepdims=True)
        choice = probs
    if arch == "deepseek_v3":
        scores = 1.0 / (1.0 + np.exp(-logits))
        biased = scores + router.e_score_correction_bias.detach().double().numpy()
        groups = biased.reshape(len(x), config.n_group, -1)
        group_score = np.sort(groups, axis=2)[:, :, -2:].sum(axis=2)
        keep = np.argsort(-group_score, axis=1)[:, :config.topk_group]
        mask = np.zeros_like(group_score, dtype=bool)
        np.put_along_axis(mask, keep, True, axis=1)
        choice = np.where(np.repeat(mask, groups.shape[2], axis=1), biased, -np.inf)
    order = np.argsort(-choice, axis=1)
    top = order[:, :k]
    ranked = np.take_along_axis(choice, order, axis=1)
    margin = ranked[:, k - 1] - ranked[:, k]
    if arch == "deepseek_v3":
        group_margin = np.sort(group_score, axis=1)
        margin = np.minimum(margin, group_margin[:, -config.topk_group]
                            - group_margin[:, -config.topk_group - 1])
    experts, weights = [], []
    for row, sel in enumerate(top):
        sel = np.sort(sel)
        if arch == "gpt_oss":
            z = np.exp(logits[row, sel] - logits[row, sel].max())
            w = z / z.sum()
        elif arch == "deepseek_v3":
            w = scores[row, sel] / (scores[row, sel].sum() + 1e-20) * config.routed_scaling_factor
        else:
            w = probs[row, sel]
            if arch == "mixtral" or config.norm_topk_prob:
                w = w / w.sum()
        experts.append(sel.tolist())
        weights.append(w)
    return experts, weights, margin


def _router_inputs(model, token_ids: list[int]) -> dict[int, tuple[object, np.ndarray]]:
    """Run one sequence alone; {layer: (router module, its input hidden states [T, H])}."""
    import torch

    from traces.collecting.capture import find_experts_modules

    layers = find_experts_modules(model)
    captured: dict[int, tuple[object, np.ndarray]] = {}
    handles = []
    for layer in layers:
        block = model.model.layers[layer].mlp
        router = block.router if hasattr(block, "router") else block.gate

        def hook(module, args, layer=layer):
            captured[layer] = (module, args[0].detach().reshape(-1, args[0].shape[-1]).numpy())

        handles.append(router.register_forward_pre_hook(hook))
    try:
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([token_ids]), use_cache=False).logits[0]
    finally:
        for h in handles:
            h.remove()
    captured["logits"] = logits.float().numpy()
    return captured


def _sequences(tokens: dict) -> dict[int, list[tuple[int, dict]]]:
    seqs: dict[int, list[tuple[int, dict]]] = {}
    for (seq, pos), entry in tokens.items():
        seqs.setdefault(seq, []).append((pos, entry))
    return {s: sorted(v, key=lambda p: p[0]) for s, v in seqs.items()}


@pytest.mark.parametrize("mode", ["score", "generate"])
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_recorded_routing_equals_router_recomputation(arch, mode, trace_models, collected,
                                                     trace_data):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(trace_models[arch], local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(trace_models[arch], local_files_only=True)
    config = model.config
    meta = json.loads(pq.read_schema(next(collected[(arch, mode)].glob("*.parquet")))
                      .metadata[b"placer"])
    tokens = _by_token(_read(collected[(arch, mode)]))
    seqs = _sequences(tokens)
    checked = skipped = bias_mattered = 0
    expected_docs = _expected_documents(mode, tokenizer, trace_data)
    decode_rows = 0
    for seq, entries in sorted(seqs.items()):
        index = seq & 0xFFFFFFFF  # the document's ordinal in its corpus (see traces.storing.schema)
        positions = [p for p, _ in entries]
        assert positions == list(range(len(entries))), "positions must be 0..n-1, no gaps"
        ids = [e["token"] for _, e in entries]
        for _, e in entries:
            assert sorted(e["layers"]) == meta["moe_layers"]
        if mode == "score":
            assert {e["phase"] for _, e in entries} == {"decode"}
            if entries[0][1]["tag"] == "prose":
                assert ids == expected_docs[index], "recorded tokens != the document's tokens"
        else:
            phases = [e["phase"] for _, e in entries]
            prompt = expected_docs[index][:len(entries)]  # --max-tokens cuts the last one
            assert len(prompt) == len(expected_docs[index]) or seq == max(seqs)
            assert phases[:len(prompt)] == ["prefill"] * len(prompt)
            assert ids[:len(prompt)] == prompt, "prefill tokens != the rendered prompt"
            assert set(phases[len(prompt):]) <= {"decode"}
            assert len(phases) - len(prompt) <= 5  # 6 new tokens: at most 5 fed back
            decode_rows += len(phases) - len(prompt)
        ref = _router_inputs(model, ids)
        if mode == "generate":
            top2 = np.sort(ref["logits"], axis=1)[:, -2:]
            greedy = ref["logits"].argmax(axis=1)
            for t in range(len(expected_docs[index]), len(ids)):
                if top2[t - 1, 1] - top2[t - 1, 0] > MARGIN:
                    assert ids[t] == greedy[t - 1], "decode tokens != the greedy continuation"
        for layer in meta["moe_layers"]:
            router, hidden = ref[layer]
            experts, weights, margin = _reference(arch, router, hidden, config)
            for t, (_, entry) in enumerate(entries):
                got_experts, got_weights = entry["layers"][layer]
                if margin[t] < MARGIN:
                    skipped += 1
                    continue
                order = np.argsort(got_experts)
                assert sorted(got_experts) == experts[t], (
                    f"seq {seq} pos {t} layer {layer}: recorded {got_experts}, router {experts[t]}")
                np.testing.assert_allclose(np.asarray(got_weights)[order], weights[t],
                                           rtol=1e-3, atol=1e-4)
                checked += 1
            if arch == "deepseek_v3":
                bias_mattered += _differs_without_bias(router, hidden, config, experts)
    assert checked > 200 and skipped <= 0.02 * (checked + skipped), (checked, skipped)
    if mode == "generate":
        assert decode_rows >= 20
    if arch == "deepseek_v3":
        assert bias_mattered > 0, "the correction bias never changed a selection: test too weak"


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_generate_mode_records_exactly_max_tokens(arch, collected):
    """--max-tokens 400 in generate mode (batches of 3 prompts of up to 40 tokens, 6 new
    tokens each): exactly 400 tokens, each with one row per MoE layer, every sequence a
    prompt then its decode rows at positions 0..n-1 (the last cut: the test above checks
    its tokens and routing, and the speculative test its spec_experts)."""
    rows = _read(collected[(arch, "generate")])
    tokens = _by_token(rows)
    assert len(tokens) == 400 and len(rows["seq_id"]) == 400 * len(
        next(iter(tokens.values()))["layers"])
    assert len({len(e["layers"]) for e in tokens.values()}) == 1
    seqs = _sequences(tokens)
    for entries in seqs.values():
        assert [p for p, _ in entries] == list(range(len(entries)))
        phases = [e["phase"] for _, e in entries]
        assert phases == sorted(phases, key=["prefill", "decode"].index)


def _differs_without_bias(router, hidden, config, experts) -> int:
    """Tokens whose selection would differ if e_score_correction_bias were ignored."""
    import torch

    saved = router.e_score_correction_bias.detach().clone()
    with torch.no_grad():
        router.e_score_correction_bias.zero_()
        unbiased, _, _ = _reference("deepseek_v3", router, hidden, config)
        router.e_score_correction_bias.copy_(saved)
    return sum(a != b for a, b in zip(unbiased, experts, strict=True))


def _expected_documents(mode: str, tokenizer, trace_data) -> list[list[int]]:
    """The token ids the collect run must have recorded, in sequence-id order."""
    if mode == "score":
        blocks = trace_data.blocks()[40:52]
        return [tokenizer(b)["input_ids"][:48] for b in blocks]
    out = []
    for line in trace_data.chat.read_text().splitlines():
        turns = json.loads(line)["turns"]
        text = tokenizer.apply_chat_template([{"role": "user", "content": t} for t in turns],
                                             tokenize=False, add_generation_prompt=True)
        out.append(tokenizer(text, add_special_tokens=False)["input_ids"][:40])
    return out


def test_random_tokens_are_uniform_ids_tagged_random(collected):
    rows = _read(collected[("qwen3_moe", "score")])
    tokens = _by_token(rows)
    random = {k: v for k, v in tokens.items() if v["tag"] == "random"}
    assert len(random) == 150
    assert {len(v["layers"]) for v in random.values()} == {3}
    ids = [v["token"] for v in random.values()]
    assert min(ids) >= 4 and len(set(ids)) > 100  # special ids 0..3 excluded, spread over vocab
    assert len({s for s, _ in random}) == 4  # 150 tokens in documents of --max-length 48


def test_schema_and_metadata(collected, trace_models, trace_data):
    from placer.checkpoint.inventory import read_inventory

    files = sorted(collected[("olmoe", "generate")].glob("*"))
    assert [f.suffix for f in files] == [".parquet"], "one complete file, no .tmp left"
    schema = pq.read_schema(files[0])
    expected = {
        "seq_id": pa.int64(), "pos": pa.int32(), "token": pa.int32(),
        "phase": pa.dictionary(pa.int32(), pa.string()), "layer": pa.int16(),
        "experts": pa.list_(pa.int16(), 2), "weights": pa.list_(pa.float32(), 2),
        "tag": pa.dictionary(pa.int32(), pa.string()),
        "spec_experts": pa.list_(pa.int16(), 2)}
    assert {f.name: f.type for f in schema} == expected
    assert schema.field("weights").nullable and not schema.field("experts").nullable
    meta = json.loads(schema.metadata[b"placer"])
    inv = read_inventory(trace_models["olmoe"])
    assert meta["fingerprint"] == inv.fingerprint
    assert meta["moe_layers"] == list(inv.moe_layers) and meta["num_layers"] == inv.num_layers
    assert (meta["experts_per_layer"], meta["top_k"]) == (8, 2)
    assert meta["tag"] == trace_data.chat.stem and meta["mode"] == "generate"
    assert meta["placer_version"] == "0.1.0" and meta["schema_version"] == 2
    assert meta["speculative"] == {"point": "moe_input", "depth": 1}
    import hashlib

    assert meta["corpus_sha256"] == hashlib.sha256(trace_data.chat.read_bytes()).hexdigest()
    table = pq.read_table(files[0])
    seq = table.column("seq_id").to_numpy()
    assert np.all(seq >> 32 == meta["run_id"])
    keys = np.stack([seq, table.column("pos").to_numpy(), table.column("layer").to_numpy()])
    assert np.all(np.diff(np.lexsort(keys[::-1])) == 1), "rows sorted by (seq, pos, layer)"


@pytest.mark.parametrize(("arch", "mode"), [*((a, "score") for a in ARCHITECTURES),
                                           ("qwen3_moe", "generate"), ("deepseek_v3", "generate")])
def test_speculative_routing_is_next_router_on_previous_block_input(arch, mode, trace_models,
                                                                    collected):
    """spec_experts of MoE layer m = layer m's router (recomputed in float64, its own top-k,
    grouping and bias) applied to the input of the previous MoE layer's block, token by token
    with each sequence run alone, best first; -1 on the first MoE layer. Every architecture
    in score mode; generate mode (prefill and decode calls) on two."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(trace_models[arch], local_files_only=True).eval()
    trace = collected[(arch, mode)]
    moe_layers = json.loads(pq.read_schema(next(trace.glob("*.parquet")))
                            .metadata[b"placer"])["moe_layers"]
    table = pa.concat_tables([pq.read_table(f) for f in sorted(trace.glob("*.parquet"))])
    rows = {name: table.column(name).to_pylist() for name in
            ("seq_id", "pos", "token", "layer", "experts", "spec_experts")}
    seqs: dict[int, dict[int, dict]] = {}
    for i, seq in enumerate(rows["seq_id"]):
        seqs.setdefault(seq, {}).setdefault(rows["pos"][i], {"token": rows["token"][i]})[
            rows["layer"][i]] = rows["spec_experts"][i]
    checked = skipped = differs = 0
    for tokens in seqs.values():
        entries = [tokens[p] for p in sorted(tokens)]
        ref = _router_inputs(model, [e["token"] for e in entries])
        assert all(e[moe_layers[0]] == [-1, -1] for e in entries)
        for before, layer in zip(moe_layers, moe_layers[1:], strict=False):
            experts, weights, margin = _reference(arch, ref[layer][0], ref[before][1],
                                                  model.config)
            for t, entry in enumerate(entries):
                if margin[t] < MARGIN or abs(weights[t][0] - weights[t][1]) < MARGIN:
                    skipped += 1
                    continue
                best_first = [experts[t][i] for i in np.argsort(-weights[t], kind="stable")]
                assert entry[layer] == best_first, (layer, t, entry[layer], best_first)
                checked += 1
        differs += sum(e[layer] != sorted(e[layer]) for e in entries for layer in moe_layers[1:])
    assert checked > 100 and skipped <= 0.05 * (checked + skipped), (checked, skipped)
    assert differs > 0, "no selection out of index order: the best-first order is untested"


def test_trace_of_schema_version_1_still_reads(collected, tmp_path, placer_run):
    """A version-1 file (no spec_experts column, no `speculative` key) beside a version-2
    one: both read, and the stats of the rows they share are those of the original."""
    import shutil

    from traces.storing.dataset import open_traces, stream_rows
    from traces.storing.schema import has_speculative

    src = collected[("qwen3_moe", "generate")]
    shutil.copytree(src, tmp_path / "new")
    old = tmp_path / "new" / "old.parquet"
    table = pq.read_table(next(src.glob("*.parquet")))
    meta = json.loads(table.schema.metadata[b"placer"])
    meta.update(schema_version=1, run_id=meta["run_id"] + 1,
                seq_id_base=(meta["run_id"] + 1) << 32)
    del meta["speculative"]
    seq = pa.array(table.column("seq_id").to_numpy() + (1 << 32))
    table = table.drop_columns(["spec_experts"]).set_column(0, "seq_id", seq)
    pq.write_table(table.replace_schema_metadata({"placer": json.dumps(meta)}), old)
    td = open_traces(tmp_path / "new")
    assert [has_speculative(m) for m in td.metas] == [False, True]
    rows = sum(len(b["experts"]) for b in stream_rows(td, ["experts", "layer"], None, None, None))
    assert rows == 2 * table.num_rows
    stats = json.loads(placer_run("traces", "stats", tmp_path / "new", "--json").output)
    single = json.loads(placer_run("traces", "stats", src, "--json").output)
    assert stats["tokens"] == 2 * single["tokens"]


def test_deepseek_records_only_routed_layers(collected):
    rows = _read(collected[("deepseek_v3", "score")])
    assert set(rows["layer"]) == {1, 2}  # layer 0 is dense (first_k_dense_replace=1)
    for experts in rows["experts"][:200]:
        groups = {e // 4 for e in experts}  # n_group=2, topk_group=1: one group of 4
        assert len(groups) == 1


def test_chat_messages_parquet_tags_and_max_tokens(tmp_path, trace_models, placer_run, trace_data):
    model = trace_models["mixtral"]
    chat = tmp_path / "conv.jsonl"
    chat.write_text("\n".join(json.dumps({"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": json.loads(line)["turns"][0]}]})
        for line in trace_data.mt_bench.read_text().splitlines()[:6]) + "\n")
    texts = tmp_path / "texts.parquet"
    pq.write_table(pa.table({"body": trace_data.blocks()[:9], "n": list(range(9))}), texts)
    plain = tmp_path / "plain.jsonl"
    plain.write_text("\n".join(json.dumps({"q": b}) for b in trace_data.blocks()[60:66]) + "\n")
    out = tmp_path / "traces"
    placer_run("collect", "--model", model, "--corpus", chat, "--corpus", trace_data.mt_bench,
               "--tag", "conv", "--tag", "mt", "--out", out, "--max-tokens", 123, "--no-progress")
    placer_run("collect", "--model", model, "--corpus", texts, "--text-field", "body", "--out", out,
               "--no-progress")
    placer_run("collect", "--model", model, "--corpus", plain, "--text-field", "q", "--out", out,
               "--max-length", 16, "--no-progress")
    tokens = _by_token(_read(out))
    per_tag: dict[str, int] = {}
    for entry in tokens.values():
        per_tag[entry["tag"]] = per_tag.get(entry["tag"], 0) + 1
    assert per_tag["conv"] == 123 and per_tag["mt"] == 123  # exact in score mode
    assert per_tag["plain"] <= 6 * 16 and per_tag["texts"] > 50
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    first = json.loads(chat.read_text().splitlines()[0])["messages"]
    rendered = tok(tok.apply_chat_template(first, tokenize=False),
                   add_special_tokens=False)["input_ids"]
    conv = sorted((k, v["token"]) for k, v in tokens.items() if v["tag"] == "conv")
    first_seq = conv[0][0][0]
    got = [t for (s, _), t in conv if s == first_seq]
    assert got == rendered[:len(got)] and len(got) == min(len(rendered), 123)


def test_a_jsonl_mixing_text_messages_and_turns_collects(tmp_path, trace_models, placer_run,
                                                         trace_data):
    """Each line is its own form; it was refused ("no field 'text' ...; fields: messages")."""
    from transformers import AutoTokenizer

    model = trace_models["qwen3_moe"]
    corpus, records = write_mixed_corpus(tmp_path / "mixed.jsonl", trace_data)
    out = tmp_path / "traces"
    placer_run("collect", "--model", model, "--corpus", corpus, "--out", out, "--max-length", 40,
               "--batch-size", 5, "--no-progress")
    tokens = _by_token(_read(out))
    sequences: dict[int, list[tuple[int, int]]] = {}
    for (seq, pos), entry in tokens.items():
        sequences.setdefault(seq, []).append((pos, entry["token"]))
    got = [[t for _, t in sorted(sequences[s])] for s in sorted(sequences)]
    tok = AutoTokenizer.from_pretrained(model)
    assert got == [rendered_record(r, tok)[:40] for r in records]
    assert {e["tag"] for e in tokens.values()} == {"mixed"}


def test_seq_ids_unique_across_runs_in_one_directory(tmp_path, trace_models, placer_run,
                                                     trace_data):
    corpus = trace_data.prose_corpus(tmp_path / "p.txt", blocks=4)
    out = tmp_path / "t"
    for extra in ([], ["--no-weights", "--tag", "again"]):  # one corpus, two samples
        placer_run("collect", "--model", trace_models["qwen3_moe"], "--corpus", corpus,
                   "--out", out, "--no-progress", *extra)
    files = sorted(out.glob("*.parquet"))
    assert len(files) == 2
    ids = [set(pq.read_table(f, columns=["seq_id"]).column(0).to_pylist()) for f in files]
    assert len(ids[0]) == len(ids[1]) == 4 and not ids[0] & ids[1]
    nulls = sorted(pq.read_table(f, columns=["weights"]).column(0).null_count for f in files)
    assert nulls[0] == 0 and nulls[1] == pq.read_metadata(files[0]).num_rows
    from traces.storing.profile import load_profile

    assert load_profile(out).sequences == 8


def test_refuses_trace_dir_of_another_model(tmp_path, trace_models, placer_run, trace_data):
    corpus = trace_data.prose_corpus(tmp_path / "p.txt", blocks=2)
    out = tmp_path / "t"
    placer_run("collect", "--model", trace_models["qwen3_moe"], "--corpus", corpus, "--out", out,
               "--no-progress")
    result = placer_run("collect", "--model", trace_models["olmoe"], "--corpus", corpus,
                        "--out", out, "--no-progress", ok=False)
    assert_one_line_error(result, "another model")
    assert len(list(out.glob("*.parquet"))) == 1


def test_interrupted_run_leaves_no_complete_file(tmp_path, trace_models, monkeypatch, trace_data):
    import traces.collecting.collect as tc
    from placer.checkpoint.inventory import read_inventory
    from traces.collecting.corpora import open_corpus

    model = trace_models["qwen3_moe"]
    inv = read_inventory(model)
    identity = tc.ModelIdentity(inv.fingerprint, inv.num_layers, tuple(inv.moe_layers),
                                inv.experts_per_layer, inv.top_k)
    corpus = open_corpus(trace_data.prose_corpus(tmp_path / "p.txt", blocks=10))
    real_score, calls = tc._score, []
    out = tmp_path / "t"

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            names = [p.name for p in out.iterdir()]
            assert len(names) == 1 and names[0].endswith(".parquet.tmp"), names
            raise KeyboardInterrupt
        return real_score(*args, **kwargs)

    monkeypatch.setattr(tc, "_score", interrupted)
    with pytest.raises(KeyboardInterrupt):
        tc.collect(model, [corpus], out, identity, tc.CollectOptions(batch_size=2,
                                                                      progress=False))
    assert len(calls) == 2 and list(out.iterdir()) == []


def test_readers_ignore_unfinished_files(collected, tmp_path):
    import shutil

    from traces.storing.profile import load_profile

    src = collected[("qwen3_moe", "score")]
    dst = tmp_path / "t"
    shutil.copytree(src, dst)
    stray = next(dst.glob("*.parquet"))
    shutil.copy(stray, dst / "killed-00000001.parquet.tmp")
    assert load_profile(dst).tokens == load_profile(src).tokens



def test_bad_inputs_give_one_line_and_exit_1(tmp_path, trace_models, placer_run, trace_data):
    import shutil

    model = trace_models["qwen3_moe"]
    out = tmp_path / "out"
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n   \n")
    wrong_field = tmp_path / "wrong.jsonl"
    wrong_field.write_text('{"body": "hello"}\n')
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text('{"text": "a"}\nnot json\n')
    cut = tmp_path / "cut.parquet"
    pq.write_table(pa.table({"text": ["hello world"] * 300}), cut, row_group_size=50)
    cut.write_bytes(cut.read_bytes()[:-20])
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(b'{"text": "a"}\n{"text": "caf\xe9"}\n')
    dense = tmp_path / "dense"
    dense.mkdir()
    (dense / "config.json").write_text(json.dumps({"model_type": "llama",
                                                   "num_hidden_layers": 2}))
    no_tok = tmp_path / "notok"
    no_tok.mkdir()
    for f in model.iterdir():
        if "token" not in f.name and f.name != "chat_template.jinja":
            shutil.copy(f, no_tok / f.name)
    corpus = trace_data.prose_corpus(tmp_path / "p.txt", blocks=2)
    cases = [
        (["--corpus", tmp_path / "missing.txt"], model, "corpus not found"),
        (["--corpus", empty], model, "is empty"),
        (["--corpus", wrong_field], model, "no field 'text'"),
        (["--corpus", wrong_field, "--text-field", "nope"], model, "no field 'nope'"),
        (["--corpus", bad_json], model, "line 2: not valid JSON"),
        (["--corpus", cut], model, "cut.parquet: not a readable Parquet file (Parquet magic"),
        (["--corpus", latin], model, "line 2: not UTF-8 text (byte 0xe9 at byte offset 27)"),
        (["--corpus", tmp_path / "p.csv"], model, "corpus not found"),
        (["--corpus", corpus], dense, "not an MoE model"),
        (["--corpus", corpus], tmp_path / "nowhere", "not found"),
        (["--corpus", corpus], no_tok, "no tokenizer"),
        (["--corpus", corpus, "--mode", "sample"], model, "--mode must be"),
        (["--corpus", corpus, "--tag", "a", "--tag", "b"], model, "one --tag per --corpus"),
        ([], model, "nothing to collect"),
    ]
    (tmp_path / "p.csv").unlink(missing_ok=True)
    for extra, checkpoint, needle in cases:
        result = placer_run("collect", "--model", checkpoint, "--out", out, "--no-progress", *extra,
                            ok=False)
        assert_one_line_error(result, needle)
    csv_corpus = tmp_path / "c.csv"
    csv_corpus.write_text("text\nhello\n")
    assert_one_line_error(placer_run("collect", "--model", model, "--corpus", csv_corpus,
                                      "--out", out, ok=False), "unknown format")
    assert not out.exists() or not list(out.glob("*.parquet"))


def test_no_progress_bar_where_stderr_is_not_a_terminal(tmp_path, trace_models, placer_run):
    """docs/cli.md: progress shows on stderr when it is a terminal; collect's bar (on by
    default) was written to a pipe or a log file all the same, its last frame left there."""
    done = placer_run("collect", "--model", trace_models["qwen3_moe"], "--random-tokens", 32,
                      "--max-length", 16, "--out", tmp_path / "t")
    assert "random: 32 tokens" in done.stdout
    assert "tok/s" not in done.stderr and "random (tokens)" not in done.stderr, done.stderr
