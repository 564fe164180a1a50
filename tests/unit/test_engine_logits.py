"""Per-request logits controls: embedding_bias (TensorRT-LLM's embeddingBias) and top_logprobs, on the
batched greedy fast path, the per-row path and next to speculative decoding."""
import pytest
import torch

from tritonllm.engine.config import EngineConfig
from tritonllm.engine.engine import LLMEngine
from tritonllm.engine.request import InvalidRequest, SamplingParams
from tritonllm.engine.sampler import top_logprobs

from engine_helpers import random_prompts, run_staggered

V = 211  # engine_helpers.TINY vocab_size


def _run(small_engine, prompts, params_of):
    """{request id: (tokens, logprobs, top lists)} plus every output seen."""
    got, outs = {}, []
    for i, p in enumerate(prompts):
        small_engine.add_request(str(i), p, params_of(i))
        got[str(i)] = ([], [], [])
    while small_engine.has_work():
        for o in small_engine.step():
            outs.append(o)
            t, lp, top = got[o.request_id]
            t += o.new_token_ids
            lp += o.new_logprobs
            top += o.new_top_logprobs
    return got, outs


def _hf_logprobs(path, ids, temperature=1.0):
    """Teacher-forced log_softmax(logits / T) of HF's model at every position: row j predicts ids[j + 1]."""
    import transformers as tf

    model = tf.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    return torch.log_softmax(logits / temperature, -1)


def _bias(entries: dict[int, float], n: int) -> torch.Tensor:
    b = torch.zeros(n, dtype=torch.float32)
    for t, v in entries.items():
        b[t] = v
    return b


# ---- top_logprobs ---------------------------------------------------------------------------------
def test_top_logprobs_sorts_ties_by_token_id():
    x = torch.tensor([[0.0, 1.0, 1.0, 1.0, -1.0, 2.0],
                      [-float("inf")] * 5 + [0.0],
                      [3.0, 2.0, 1.0, 0.0, -1.0, -2.0]])
    assert top_logprobs(x, [3, 3, 2]) == [[(5, 2.0), (1, 1.0), (2, 1.0)],
                                         [(5, 0.0), (0, -float("inf")), (1, -float("inf"))],
                                         [(0, 3.0), (1, 2.0)]]
    assert top_logprobs(x, [2, 1, 20])[2] == [(0, 3.0), (1, 2.0), (2, 1.0), (3, 0.0), (4, -1.0), (5, -2.0)]


def test_greedy_top_logprobs_match_hf_and_the_token_logprob(small_engine, llama_ckpt):
    prompts = random_prompts(3, V, 5, 12, seed=21)
    ks = [5, 0, 20]  # one batch on the fast path: mixed asks
    got, outs = _run(small_engine, prompts, lambda i: SamplingParams(max_tokens=6, end_id=-1, return_log_probs=True,
                                                              top_logprobs=ks[i]))
    for o in outs:  # aligned with the delta, empty when not asked
        assert len(o.new_top_logprobs) == (len(o.new_token_ids) if ks[int(o.request_id)] else 0)
    assert got["1"][2] == []
    for i in (0, 2):
        tokens, lps, tops = got[str(i)]
        ref = _hf_logprobs(llama_ckpt, prompts[i] + tokens)
        for j, (tok, lp, top) in enumerate(zip(tokens, lps, tops)):
            assert len(top) == ks[i]
            assert top[0] == (tok, lp)               # greedy: the chosen token heads the list, same value
            assert [v for _, v in top] == sorted((v for _, v in top), reverse=True)
            row = ref[len(prompts[i]) - 1 + j]
            want = torch.topk(row, ks[i])
            assert [t for t, _ in top] == want.indices.tolist()
            assert torch.allclose(torch.tensor([v for _, v in top]), want.values, atol=1e-4)


def test_sampled_top_logprobs_are_of_the_temperature_scaled_distribution(small_engine, llama_ckpt):
    prompt = [7, 8, 9, 10, 11]
    params = SamplingParams(max_tokens=5, end_id=-1, temperature=1.7, top_k=3, seed=5, return_log_probs=True,
                            top_logprobs=4)
    got, _ = _run(small_engine, [prompt], lambda i: params)
    tokens, lps, tops = got["0"]
    ref = _hf_logprobs(llama_ckpt, prompt + tokens, temperature=1.7)
    for j, (tok, lp, top) in enumerate(zip(tokens, lps, tops)):
        row = ref[len(prompt) - 1 + j]
        want = torch.topk(row, 4)                    # before top-k truncation: 4 entries although top_k=3
        assert [t for t, _ in top] == want.indices.tolist()
        assert torch.allclose(torch.tensor([v for _, v in top]), want.values, atol=1e-4)
        assert abs(lp - float(row[tok])) < 1e-4
        assert tok in [t for t, _ in top[:3]]        # drawn from the top 3


def test_top_logprobs_stop_at_eos_with_the_tokens(small_engine):
    """EOS is not an output token: its top list is not reported either."""
    prompts = random_prompts(6, V, 3, 6, seed=23)
    fulls = _run(small_engine, prompts, lambda i: SamplingParams(max_tokens=10, end_id=-1))[0]
    prompt, full = next((prompts[int(k)], t) for k, (t, _, _) in fulls.items() if len(set(t[:4])) > 1)
    eos = next(t for t in full if t != full[0])
    cut = full.index(eos)
    tokens, _, tops = _run(small_engine, [prompt], lambda i: SamplingParams(max_tokens=10, end_id=eos,
                                                                      top_logprobs=2))[0]["0"]
    assert tokens == full[:cut] and len(tops) == cut and [t[0][0] for t in tops] == full[:cut]


# ---- embedding_bias -------------------------------------------------------------------------------
def test_minus_inf_bias_bans_a_token_like_a_bad_word(small_engine):
    prompt = [12, 13, 14]
    full, _, _ = _run(small_engine, [prompt], lambda i: SamplingParams(max_tokens=8, end_id=-1))[0]["0"]
    banned, _, _ = _run(small_engine, [prompt], lambda i: SamplingParams(max_tokens=8, end_id=-1,
                                                                   bad_words=[[full[0]]]))[0]["0"]
    short = _bias({full[0]: -float("inf")}, full[0] + 1)  # shorter than the vocabulary: zero-padded
    biased, _, tops = _run(small_engine, [prompt], lambda i: SamplingParams(max_tokens=8, end_id=-1, embedding_bias=short,
                                                                      top_logprobs=1))[0]["0"]
    assert full[0] not in biased and biased == banned
    assert [t[0][0] for t in tops] == biased         # log probs of the biased logits


def test_bias_forces_a_token_on_greedy_and_sampled_rows_and_leaves_batch_mates_alone(small_engine):
    prompts = random_prompts(3, V, 4, 9, seed=22)
    plain, _ = _run(small_engine, prompts, lambda i: SamplingParams(max_tokens=6, end_id=-1))
    forced = _bias({150: 1e4}, V)
    params = [SamplingParams(max_tokens=6, end_id=-1),
              SamplingParams(max_tokens=6, end_id=-1, embedding_bias=forced, top_logprobs=2),
              SamplingParams(max_tokens=6, end_id=-1, embedding_bias=forced, temperature=1.0, top_p=0.9, seed=3)]
    mixed, _ = _run(small_engine, prompts, lambda i: params[i])
    assert mixed["0"][0] == plain["0"][0]
    assert mixed["1"][0] == [150] * 6 and mixed["2"][0] == [150] * 6
    assert all(top[0][0] == 150 and top[0][1] == 0.0 for top in mixed["1"][2])


def test_bias_is_stored_once_on_the_device_padded_to_the_vocabulary(small_engine):
    bias = torch.tensor([0.5, -1.0], dtype=torch.float64)
    small_engine.add_request("b", [5, 6, 7], SamplingParams(max_tokens=3, end_id=-1, embedding_bias=bias))
    req = small_engine.requests["b"]
    kept = req.embedding_bias
    assert kept.dtype == torch.float32 and kept.shape == (V,) and kept.device == small_engine.model.device
    assert kept[:2].tolist() == [0.5, -1.0] and not kept[2:].any()
    small_engine.step()
    assert req.embedding_bias is kept and kept.data_ptr() == req.embedding_bias.data_ptr()
    small_engine.abort("b")


@pytest.mark.parametrize("params,needle", [
    (SamplingParams(embedding_bias=torch.zeros(V + 1)), "embedding_bias has 212 entries"),
    (SamplingParams(embedding_bias=torch.tensor([0.0, float("nan")])), "embedding_bias holds NaN"),
    (SamplingParams(embedding_bias=torch.tensor([float("inf")])), "embedding_bias holds NaN or \\+inf"),
    (SamplingParams(embedding_bias=torch.zeros(2, 3)), "embedding_bias must be a non-empty 1-D"),
    (SamplingParams(embedding_bias=torch.full((V,), float("-inf"))), "bans every token"),
    (SamplingParams(embedding_bias=torch.tensor([0.0, 3e38])), "within"),  # overflows once added
    (SamplingParams(embedding_bias=torch.zeros(0)), "embedding_bias must be a non-empty 1-D"),
    (SamplingParams(embedding_bias=torch.zeros(3, dtype=torch.int32)), "floating-point"),
    (SamplingParams(top_logprobs=21), "top_logprobs must be in \\[0, 20\\]"),
    (SamplingParams(top_logprobs=-1), "top_logprobs"),
])
def test_invalid_logits_controls_name_the_input(small_engine, params, needle):
    with pytest.raises(InvalidRequest, match=needle):
        small_engine.add_request("bad", [1, 2], params)
    assert not small_engine.has_work()


def test_full_width_and_minus_inf_biases_are_accepted(small_engine):
    small_engine.validate([1, 2], SamplingParams(embedding_bias=torch.zeros(V)))
    small_engine.validate([1, 2], SamplingParams(embedding_bias=torch.tensor([-float("inf"), 0.0])))


def test_biased_and_top_logprobs_requests_do_not_draft(llama_ckpt):
    """The verifiers see raw logits and report no top log-probs: such requests decode without drafts, with
    the output of the engine without speculation."""
    base = random_prompts(2, V, 6, 9, seed=11)
    prompts = [p * 4 for p in base]                  # looping prompts: drafts would be proposed
    cfg = dict(block_size=4, max_kv_tokens=2048, max_num_tokens=64)
    params = [SamplingParams(max_tokens=12, end_id=-1, embedding_bias=_bias({3: -2.0}, 8)),
              SamplingParams(max_tokens=12, end_id=-1, top_logprobs=3)]
    spec = LLMEngine(llama_ckpt, EngineConfig(max_draft_len=4, **cfg))
    on, _ = _run(spec, prompts, lambda i: params[i])
    off, _ = _run(LLMEngine(llama_ckpt, EngineConfig(**cfg)), prompts, lambda i: params[i])
    assert on == off and spec.stats.draft_tokens == 0
    plain, _ = run_staggered(spec, prompts, lambda i: SamplingParams(max_tokens=12, end_id=-1))
    assert spec.stats.draft_tokens > 0               # the same prompts draft without those controls
    assert spec.num_free_blocks == spec.pool.num_blocks


# ---- prompt_logprobs -------------------------------------------------------------------------------
def test_prompt_logprobs_equal_hf_across_chunks_and_beside_the_prefix_cache(llama_ckpt):
    """Every prompt token after the first gets log P(token | before it) equal to HF's teacher-forced log-softmax,
    whether the prompt is computed in one step or in chunks of chunked prefill (max_num_tokens 16 < 50), beside a
    request that filled the prefix cache with the same prompt (the scored one computes every row itself, so it is
    never short of rows), once, on the first output; generation goes on as usual and every block comes back."""
    eng = LLMEngine(llama_ckpt, EngineConfig(block_size=4, max_kv_tokens=2048, max_num_tokens=16,
                                             enable_prefix_caching=True))
    prompt = random_prompts(1, V, 50, 51, seed=3)[0]
    ref = _hf_logprobs(llama_ckpt, prompt)
    want = ref[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])]
    eng.add_request("warm", prompt, SamplingParams(max_tokens=2))  # its full blocks go to the prefix cache
    while eng.has_work():
        eng.step()
    cached = eng.num_free_blocks  # the warm prompt's full blocks stay cached (and free to evict)
    for rid in ("a", "b"):
        eng.add_request(rid, prompt, SamplingParams(max_tokens=3, prompt_logprobs=True, return_log_probs=True))
    outs = []
    while eng.has_work():
        outs += eng.step()
    for rid in ("a", "b"):
        mine = [o for o in outs if o.request_id == rid]
        scored = [o.prompt_logprobs for o in mine if o.prompt_logprobs is not None]
        assert len(scored) == 1 and mine[0].prompt_logprobs is not None, "once, on the first output"
        assert torch.allclose(torch.tensor(scored[0]), want, atol=1e-4), (scored[0][:4], want[:4])
        assert sum(len(o.new_token_ids) for o in mine) == 3
    assert eng.num_free_blocks == cached
    assert eng.stats.prefix_hit_tokens == 0, "a scored prompt computes every row itself"


def test_prompt_logprobs_do_not_go_with_pooling():
    with pytest.raises(InvalidRequest, match="prompt_logprobs and pooling"):
        SamplingParams(prompt_logprobs=True, pooling="mean").verify()
