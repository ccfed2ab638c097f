"""Constrained decoding in the engine (issue 24 item 3): the demo model under a JSON schema or a GBNF grammar
writes output the grammar accepts and stops when it is complete; with MTP the grammar masks both the
drafts and the main model's rows, so greedy output is what plain decoding gives and a draft the grammar
forbids is rejected."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest

from runner.engine.engine import Engine, EngineConfig
from runner.engine.grammar import MAX_GRAMMAR_CHARS, GrammarError, GrammarVocab
from runner.engine.sampling import SamplingParams
from runner.package_data import demo_model_path
from runner.spec.config import DraftConfig
from runner.spec.drafter import MTPDrafter
from runner.spec.verify import one_hot

PACKAGE = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 24},
    "section": {"type": "string", "enum": ["admin", "devel", "libs", "net", "utils", "web"]},
    "depends": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 3},
    "essential": {"type": "boolean"}},
    "required": ["name", "section", "depends", "essential"], "additionalProperties": False}
MTP = DraftConfig("mtp")


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine.load(demo_model_path(), EngineConfig(n_ctx=512))


@pytest.fixture(scope="module")
def vocab(engine: Engine) -> GrammarVocab:
    return GrammarVocab(engine.tokenizer)


@pytest.fixture(scope="module")
def prompt(engine: Engine) -> list[int]:
    text = engine.tokenizer.render_chat([{"role": "user", "content": "What is curl? Answer in JSON."}])
    return engine.tokenizer.encode(text, add_special=True, parse_special=True)


@pytest.mark.parametrize("draft", [None, MTP], ids=["plain", "mtp"])
@pytest.mark.parametrize("temperature, seed", [(0.0, None), (0.8, 1), (1.2, 2)])
def test_output_under_a_json_schema_parses_validates_and_stops(engine, vocab, prompt, draft, temperature, seed) -> None:
    sampling = SamplingParams(temperature=temperature, seed=seed, grammar=vocab.json_schema(PACKAGE))
    gen = engine.generate(prompt, 200, sampling, draft=draft).run()
    jsonschema.validate(json.loads(gen.text), PACKAGE)
    assert gen.finish_reason == "stop"
    assert not any(engine.tokenizer.is_eog(t) for t in gen.tokens)  # the grammar's end is the generation's


def test_greedy_mtp_under_a_grammar_gives_plain_decodings_tokens(engine, vocab, prompt) -> None:
    sampling = SamplingParams(temperature=0.0, grammar=vocab.json_schema(PACKAGE))
    plain = engine.generate(prompt, 200, sampling).run()
    # A fixed depth: the adaptive policy, shared by the module's engine, may sit at depth 0 between its
    # probes when this machine's timings make verify rows dear (the numpy backend), and then drafts nothing.
    drafted = engine.generate(prompt, 200, sampling, draft=DraftConfig("mtp", 3, adaptive=False)).run()
    assert drafted.tokens == plain.tokens
    assert drafted.draft.accepted_n > 0  # the demo's NextN block drafts inside the grammar too


class ForbiddenDrafter(MTPDrafter):
    """TEST-ONLY: runs the real NextN block, then proposes `forbidden` (a control token, which no JSON
    grammar allows) at every depth with all its probability mass, as a drafter ignoring the grammar would."""

    def draft(self, token, depth, pick):
        real, _, caught_up = super().draft(token, depth, pick)
        forbidden = self.forbidden
        return [forbidden] * len(real), [one_hot(self.block.cfg.n_vocab, forbidden)] * len(real), caught_up


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_a_draft_the_grammar_forbids_is_rejected(engine, vocab, prompt, temperature) -> None:
    sampling = SamplingParams(temperature=temperature, seed=3, grammar=vocab.json_schema(PACKAGE))
    plain = engine.generate(prompt, 120, sampling).run()
    fresh = Engine.load(demo_model_path(), EngineConfig(n_ctx=512))
    drafter = ForbiddenDrafter(fresh.nextn[0], fresh.n_ctx, fresh.config.ubatch)
    drafter.forbidden = _control_token(fresh)
    fresh.drafter = drafter
    drafted = fresh.generate(prompt, 120, sampling, draft=MTP).run()
    assert drafted.draft.drafted_n > 0 and drafted.draft.accepted_n == 0
    jsonschema.validate(json.loads(drafted.text), PACKAGE)
    if temperature == 0.0:
        assert drafted.tokens == plain.tokens


def test_a_gbnf_grammar_holds_and_ends_the_generation(engine, vocab, prompt) -> None:
    grammar = vocab.gbnf('root ::= "The answer is " ("yes" | "no") "."')
    for seed in range(3):
        gen = engine.generate(prompt, 50, SamplingParams(temperature=1.0, seed=seed, grammar=grammar)).run()
        assert gen.text in ("The answer is yes.", "The answer is no.") and gen.finish_reason == "stop"


def test_max_tokens_cuts_a_constrained_output_with_length(engine, vocab, prompt) -> None:
    gen = engine.generate(prompt, 5, SamplingParams(temperature=0.0, grammar=vocab.json_schema(PACKAGE))).run()
    assert gen.finish_reason == "length" and len(gen.tokens) == 5 and gen.text.startswith('{"')


def test_the_mask_ahead_of_the_committed_tokens_is_the_mask_after_committing_them(engine, vocab) -> None:
    grammar = vocab.json_schema(PACKAGE)
    walk = engine.tokenizer.encode('{"name": "curl", "section": "web"', parse_special=False)
    looking = grammar.start()
    ahead = [looking.allowed(walk[:i]) for i in range(len(walk) + 1)]
    committed = grammar.start()
    for i, token in enumerate(walk):
        np.testing.assert_array_equal(committed.allowed(), ahead[i])
        assert ahead[i][token]
        committed.accept(token)
        looking.accept(token)  # a commit after looking ahead keeps the masks exact
        np.testing.assert_array_equal(looking.allowed(), committed.allowed())
    np.testing.assert_array_equal(committed.allowed(), ahead[-1])
    with pytest.raises(GrammarError, match="outside the grammar"):
        committed.accept(_control_token(engine))


@pytest.mark.parametrize("schema, message", [
    ({"type": "objec"}, "the JSON schema is not usable: .*objec"),
    ({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}, "not usable: .*nowhere"),
])
def test_a_bad_schema_is_one_line(vocab, schema, message) -> None:
    with pytest.raises(GrammarError, match=message) as err:
        vocab.json_schema(schema)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("text, message", [('root ::= "a', "does not parse as GBNF"),
                                           ("root ::= missing", "does not parse as GBNF: Rule 'missing' not found"),
                                           ("root ::= " + "(" * 5000 + '"a"' + ")" * 5000, "does not parse as GBNF")])
def test_a_bad_grammar_is_one_line(vocab, text, message) -> None:
    with pytest.raises(GrammarError, match=message) as err:
        vocab.gbnf(text)
    assert "\n" not in str(err.value)


def test_an_oversized_grammar_is_refused_before_it_is_parsed(vocab) -> None:
    with pytest.raises(GrammarError, match=f"at most {MAX_GRAMMAR_CHARS}"):
        vocab.gbnf('root ::= "' + "a" * MAX_GRAMMAR_CHARS + '"')


def _control_token(engine: Engine) -> int:
    (sop,) = engine.tokenizer.encode("<sop>", parse_special=True)
    assert not engine.tokenizer.is_eog(sop)
    return sop
