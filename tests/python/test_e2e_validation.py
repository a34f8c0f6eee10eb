"""Every bad input gets INVALID_ARGUMENT naming the field, the value and the
limit; the stack then serves a normal request."""
import grpc
import pytest


def request(pb, **kw):
    sampling = kw.pop("sampling", {})
    sampling.setdefault("max_tokens", 8)
    text = kw.pop("text", b"hello world")
    if "token_ids" in kw:
        return pb.gen.GenerateRequest(token_ids=pb.gen.TokenIds(ids=kw.pop("token_ids")),
                                      sampling=pb.gen.SamplingParams(**sampling), **kw)
    return pb.gen.GenerateRequest(text=text, sampling=pb.gen.SamplingParams(**sampling), **kw)


CASES = [
    ("empty text", dict(text=b""), ["prompt is empty"]),
    ("empty token ids", dict(token_ids=[]), ["prompt is empty"]),
    ("token id out of vocab", dict(token_ids=[1, 2, 10_000_000]), ["token_ids.ids[2]", "10000000", "vocabulary"]),
    ("max_tokens zero", dict(sampling={"max_tokens": 0}), ["sampling.max_tokens", "= 0", "> 0"]),
    ("max_tokens negative", dict(sampling={"max_tokens": -5}), ["sampling.max_tokens", "-5", "> 0"]),
    ("too long", dict(sampling={"max_tokens": 1_000_000}), ["max_tokens", "1000000", "max_model_len"]),
    ("temperature negative", dict(sampling={"temperature": -0.5}), ["sampling.temperature", "-0.5", ">= 0"]),
    ("top_p zero", dict(sampling={"top_p": 0.0}), ["sampling.top_p", "= 0", "(0, 1]"]),
    ("top_p above one", dict(sampling={"top_p": 1.5}), ["sampling.top_p", "1.5", "(0, 1]"]),
    ("top_k negative", dict(sampling={"top_k": -1}), ["sampling.top_k", "-1", ">= 0"]),
    ("invalid utf-8 text", dict(text=b"caf\xc3"), ["text", "UTF-8"]),
    ("overlong utf-8", dict(text=b"\xc0\xafetc"), ["text", "UTF-8"]),
    ("surrogate in utf-8", dict(text=b"\xed\xa0\x80"), ["text", "UTF-8"]),
    ("invalid utf-8 stop", dict(sampling={"stop": [b"\xff"]}), ["sampling.stop[0]", "UTF-8"]),
    ("empty stop", dict(sampling={"stop": [b""]}), ["sampling.stop[0]", "empty"]),
    ("unknown lane", dict(lane="vip"), ["lane", "vip", "interactive", "batch"]),
    ("min_p above one", dict(sampling={"min_p": 1.5}), ["sampling.min_p", "1.5", "[0, 1]"]),
    ("presence penalty", dict(sampling={"presence_penalty": 3.0}), ["sampling.presence_penalty", "3", "[-2, 2]"]),
    ("frequency penalty", dict(sampling={"frequency_penalty": -2.5}), ["sampling.frequency_penalty", "-2.5", "[-2, 2]"]),
    ("repetition penalty zero", dict(sampling={"repetition_penalty": 0.0}), ["sampling.repetition_penalty", "= 0", "> 0"]),
    ("logprobs too many", dict(sampling={"logprobs": 21}), ["sampling.logprobs", "21", "[0, 20]"]),
    ("logprobs negative", dict(sampling={"logprobs": -1}), ["sampling.logprobs", "-1", "[0, 20]"]),
    ("temperature nan", dict(sampling={"temperature": float("nan")}), ["sampling.temperature", "nan", ">= 0"]),
    ("text that cannot fit", dict(text=b"a" * (1 << 20)), ["text is 1048576 bytes", "max_model_len"]),
    ("request id too long", dict(request_id="r" * 129), ["request_id", "129", "128"]),
    ("request id with a newline", dict(request_id="a\nb"), ["request_id", "control character", "0x0a"]),
    ("too many stop token ids", dict(sampling={"stop_token_ids": [1] * 1025}),
     ["sampling.stop_token_ids", "1025", "1024"]),
]


@pytest.mark.parametrize("name,kw,needles", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("streaming", [False, True], ids=["unary", "stream"])
def test_bad_input_is_invalid_argument(gen_stub, ferry_pb, name, kw, needles, streaming):
    req = request(ferry_pb, **kw)
    with pytest.raises(grpc.RpcError) as err:
        if streaming:
            list(gen_stub.GenerateStream(req, timeout=30))
        else:
            gen_stub.Generate(req, timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    for needle in needles:
        assert needle in err.value.details(), f"{needle!r} not in {err.value.details()!r}"
    # The next request is served normally.
    ok = gen_stub.Generate(request(ferry_pb, sampling={"max_tokens": 3, "ignore_eos": True}), timeout=30)
    assert len(ok.token_ids) == 3
    assert ok.finish_reason == ferry_pb.gen.FINISH_REASON_LENGTH


def test_defaults_fill_in_unset_fields(gen_stub, ferry_pb):
    req = ferry_pb.gen.GenerateRequest(text=b"defaults", sampling=ferry_pb.gen.SamplingParams(ignore_eos=True))
    resp = gen_stub.Generate(req, timeout=30)
    assert len(resp.token_ids) == 16  # max_tokens unset: 16
    assert resp.request_id.startswith("req-")


def test_request_id_is_echoed(gen_stub, ferry_pb):
    resp = gen_stub.Generate(request(ferry_pb, request_id="my-id-42"), timeout=30)
    assert resp.request_id == "my-id-42"
