"""A neutral load generator for OpenAI-compatible servers, shared by the serving benchmark and the
configuration optimiser: synthetic workloads, the open-loop streaming client and the summary row."""
from .client import Result, drive, send_one
from .summary import summarise, summarise_tpot
from .workload import WORDS, Req, chat_mix, poisson_arrivals, random_tokens, shared_prefix, words_text

__all__ = ["Result", "drive", "send_one", "summarise", "summarise_tpot", "WORDS", "Req", "chat_mix",
           "poisson_arrivals", "random_tokens", "shared_prefix", "words_text"]
