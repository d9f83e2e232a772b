"""Reasoning split helpers: text mode, tokens mode, mode resolution and subsequence search."""

from __future__ import annotations

import pytest

from steer_hydra.evaluation.thinking import (
    DEFAULT_THINK_TAGS,
    ThinkingSplit,
    find_subsequence,
    resolve_split_mode,
    split_thinking,
    split_thinking_ids,
    tag_token_ids,
)


class WordTokenizer:
    """One id per whitespace-separated word; `<open>`/`<close>` are special (dropped by skip_special_tokens)."""

    pad_token_id = 0

    def __init__(self, special=("<open>", "<close>"), empty=()):
        self.vocab = {"<pad>": 0}
        self.special = set(special) | {"<pad>"}
        self.empty = set(empty)

    def _id(self, word):
        return self.vocab.setdefault(word, len(self.vocab))

    def encode(self, text, add_special_tokens=False):
        if text in self.empty:
            return []
        return [self._id(w) for w in text.split()]

    def ids(self, text):
        return self.encode(text)

    def decode(self, ids, skip_special_tokens=False):
        words = {v: k for k, v in self.vocab.items()}
        out = [words[i] for i in ids if not (skip_special_tokens and words[i] in self.special)]
        return " ".join(out)


# ---------------------------------------------------------------------- find_subsequence
def test_find_subsequence_first_occurrence_and_start():
    assert find_subsequence([1, 2, 3, 2, 3], [2, 3]) == 1
    assert find_subsequence([1, 2, 3, 2, 3], [2, 3], start=2) == 3
    assert find_subsequence([1, 2, 3], [3, 4]) == -1
    assert find_subsequence([], [1]) == -1


def test_find_subsequence_rejects_empty_pattern():
    with pytest.raises(ValueError, match="empty id sequence"):
        find_subsequence([1, 2], [])


# ---------------------------------------------------------------------- text mode (item 46, 48, 49)
def test_text_split_at_close_tag_drops_open_tag_and_left_strips_answer():
    assert split_thinking("<think>plan</think> answer") == ThinkingSplit("plan", "answer", closed=True)


def test_text_split_uses_last_close_tag():
    split = split_thinking("<think>a</think> b </think> c")
    assert (split.reasoning, split.answer) == ("a</think> b", "c")


def test_text_split_truncates_at_stop_strings_first():
    # the stop string sits before the close tag, so no close tag survives: open-only, unclosed
    split = split_thinking("<think>plan STOP</think> answer", stop_strings=["STOP"])
    assert split == ThinkingSplit("plan", "", closed=False)
    split = split_thinking("<think>plan</think> answer STOP more", stop_strings=["STOP"])
    assert (split.reasoning, split.answer) == ("plan", "answer ")


def test_text_open_tag_only_is_unclosed_reasoning():
    assert split_thinking("<think>still thinking") == ThinkingSplit("still thinking", "", closed=False)


def test_text_neither_tag():
    assert split_thinking("plain answer") is None
    assert split_thinking("all thinking", opened_at_start=True) == ThinkingSplit("all thinking", "", closed=False)


def test_text_close_only_with_or_without_opened_at_start():
    for opened in (False, True):
        assert split_thinking("R</think>A", opened_at_start=opened) == ThinkingSplit("R", "A", closed=True)


def test_text_custom_tags():
    assert split_thinking("[[x]] y", ("[[", "]]")) == ThinkingSplit("x", "y")
    assert DEFAULT_THINK_TAGS == ("<think>", "</think>")


# ---------------------------------------------------------------------- tokens mode (items 47-49)
@pytest.fixture
def words():
    tok = WordTokenizer()
    return tok, tag_token_ids(tok, ("<open>", "<close>"))


def test_tokens_split_truncates_only_the_answer(words):
    tok, tags = words
    split = split_thinking_ids(tok.ids("<open> R <close> A stop x"), tok, tags, stop_strings=["stop"])
    assert (split.reasoning, split.answer, split.closed) == ("R", "A", True)


def test_tokens_reasoning_is_kept_verbatim_when_opened_at_start(words):
    tok, tags = words
    split = split_thinking_ids(tok.ids("R plan stop"), tok, tags, opened_at_start=True, stop_strings=["stop"])
    assert split == ThinkingSplit("R plan stop", "", closed=False)


def test_tokens_close_only(words):
    tok, tags = words
    for opened in (False, True):
        split = split_thinking_ids(tok.ids("R <close> A"), tok, tags, opened_at_start=opened)
        assert (split.reasoning, split.answer, split.closed) == ("R", "A", True)


def test_tokens_ids_before_open_join_the_answer(words):
    tok, tags = words
    split = split_thinking_ids(tok.ids("pre <open> R <close> A"), tok, tags)
    assert (split.reasoning, split.answer) == ("R", "pre A")


def test_tokens_unclosed_and_empty_answer(words):
    tok, tags = words
    assert split_thinking_ids(tok.ids("<open> R more"), tok, tags) == ThinkingSplit("R more", "", closed=False)
    closed_empty = split_thinking_ids(tok.ids("<open> R <close>"), tok, tags)
    assert closed_empty == ThinkingSplit("R", "", closed=True)


def test_tokens_no_tags_no_split_and_trailing_pads_ignored(words):
    tok, tags = words
    assert split_thinking_ids(tok.ids("just an answer"), tok, tags) is None
    split = split_thinking_ids([*tok.ids("<open> R <close> A"), 0, 0], tok, tags)
    assert (split.reasoning, split.answer) == ("R", "A")


# ---------------------------------------------------------------------- resolve_split_mode (items 20, 21)
def test_resolve_split_mode_none_tags():
    assert resolve_split_mode(WordTokenizer(), None, "auto") == (None, None)


def test_resolve_split_mode_auto_picks_text_for_round_tripping_tags():
    mode, ids = resolve_split_mode(WordTokenizer(special=()), ("<open>", "<close>"), "auto")
    assert (mode, ids) == ("text", None)


def test_resolve_split_mode_auto_picks_tokens_for_special_tags():
    tok = WordTokenizer()
    mode, ids = resolve_split_mode(tok, ("<open>", "<close>"), "auto")
    assert mode == "tokens"
    assert ids == (tok.ids("<open>"), tok.ids("<close>"))


def test_resolve_split_mode_explicit_beats_auto():
    assert resolve_split_mode(WordTokenizer(), ("<open>", "<close>"), "text")[0] == "text"
    assert resolve_split_mode(WordTokenizer(special=()), ("<open>", "<close>"), "tokens")[0] == "tokens"


def test_resolve_split_mode_empty_encoding_raises():
    tok = WordTokenizer(empty={"   "})
    with pytest.raises(ValueError, match="empty id sequence"):
        resolve_split_mode(tok, ("<open>", "   "), "auto")


def test_resolve_split_mode_unknown_mode():
    with pytest.raises(ValueError, match="reasoning_split"):
        resolve_split_mode(WordTokenizer(), ("<open>", "<close>"), "bytes")


def test_resolve_split_mode_on_the_tiny_tokenizer():
    from steer_hydra.models import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    assert resolve_split_mode(tok, DEFAULT_THINK_TAGS, "auto")[0] == "text"
    assert resolve_split_mode(tok, ("<|user|>", "<|assistant|>"), "auto")[0] == "tokens"
