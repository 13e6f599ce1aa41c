"""Synthetic request streams: Poisson arrivals, a seeded mix of short chat turns and long prompts."""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import List, Tuple, Union


WORDS = ("the a of to and in is it you that he was for on are with as his they be at one have this from or "
          "had by word but what some we can out other were all there when up use your how said an each she "
          "which do their time if will way about many then them write would like so these her long make thing "
          "see him two has look more day could go come did number sound no most people my over know water than "
          "call first who may down side been now find any new work part take get place made live where after "
          "back little only round man year came show every good me give our under name very through just form "
          "sentence great think say help low line differ turn cause much mean before move right boy old too same "
          "tell does set three want air well also play small end put home read hand port large spell add even "
          "land here must big high such follow act why ask men change went light kind off need house picture "
          "try us again animal point mother world near build self earth father head stand own page should "
          "country found answer school grow study still learn plant cover food sun four between state keep eye "
          "never last let thought city tree cross farm hard start might story saw far sea draw left late run").split()


@dataclass
class Req:
    arrival: float
    prompt: Union[str, List[int]]   # text, or token ids (sent over /v1/completions)
    max_tokens: int
    extra: dict = field(default_factory=dict)   # more body fields (e.g. ignore_eos)


def chat_mix(n: int, rate: float, seed: int, long_frac: float = 0.2) -> List[Req]:
    """n requests, Poisson arrivals at `rate`/s: short chat turns (~20-100 words, 16-64 output
    tokens) and long-prompt requests (~300-500 words, 16-32 output tokens)."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        long_ = rng.random() < long_frac
        words = rng.randint(300, 500) if long_ else rng.randint(20, 100)
        text = words_text(rng, words)
        prompt = ("Summarise this in one sentence: " if long_ else "Continue this story: ") + text
        out.append(Req(t, prompt, rng.randint(16, 32) if long_ else rng.randint(16, 64)))
    return out




def words_text(rng: random.Random, n: int) -> str:
    """n words drawn from WORDS: filler text of a known length in words."""
    return " ".join(rng.choice(WORDS) for _ in range(n))


def poisson_arrivals(n: int, rate: float, rng: random.Random) -> List[float]:
    """n arrival times (s) of a Poisson process at `rate`/s; rate inf: all at 0 (a burst)."""
    t, out = 0.0, []
    for _ in range(n):
        t += 0.0 if rate == float("inf") else rng.expovariate(rate)
        out.append(t)
    return out


def random_tokens(n: int, rate: float, seed: int, input_len: int = 256, output_len: int = 64,
                  ids: Tuple[int, int] = (100, 49152)) -> List[Req]:
    """n fresh prompts of input_len random token ids in [ids[0], ids[1]), exactly output_len tokens
    out (ignore_eos): `vllm bench serve --dataset-name random`'s workload."""
    rng = random.Random(seed)
    return [Req(t, [rng.randrange(*ids) for _ in range(input_len)], output_len, {"ignore_eos": True})
            for t in poisson_arrivals(n, rate, rng)]


def shared_prefix(n: int, rate: float, seed: int, prefix_len: int = 512, unique_len: int = 64,
                  output_len: int = 64, ids: Tuple[int, int] = (100, 49152)) -> List[Req]:
    """n prompts that all start with the same prefix_len random token ids, then unique_len of their
    own; exactly output_len tokens out (ignore_eos)."""
    rng = random.Random(seed)
    prefix = [rng.randrange(*ids) for _ in range(prefix_len)]
    return [Req(t, prefix + [rng.randrange(*ids) for _ in range(unique_len)], output_len, {"ignore_eos": True})
            for t in poisson_arrivals(n, rate, rng)]
