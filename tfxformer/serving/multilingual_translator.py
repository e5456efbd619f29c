"""A translator for one model of several target languages: :class:`MultilingualTranslator`,
and :func:`make_translator`, which makes the translator a model needs.
"""

from __future__ import annotations

from tfxformer import multilingual
from tfxformer.serving.inputs import (
    EXAMPLE_OPTION_SPECS,
    LANGUAGE_SPEC,
    OPTION_SPECS,
    SAMPLING_SPECS,
    TARGET_SPEC,
    TEXT_SPEC,
)
from tfxformer.serving.nbest_request import NBEST_SPECS
from tfxformer.serving.text import TextCodec
from tfxformer.serving.translator import Translator, signature

__all__ = ["MultilingualTranslator", "make_translator"]


def make_translator(model, sentencepiece_model: bytes, target_languages=(), **options):
    """A :class:`Translator`, or a :class:`MultilingualTranslator` for a multilingual
    model (`target_languages`: its languages, e.g. ("de", "fr"); () for one target)."""
    if target_languages:
        return MultilingualTranslator(model, sentencepiece_model, target_languages, **options)
    return Translator(model, sentencepiece_model, **options)


class MultilingualTranslator(Translator):
    """A :class:`Translator` for one model of several target languages (Johnson et al.,
    2017; :mod:`tfxformer.multilingual`): every signature takes, after `text`, a
    `target_language` input ((N,) tf.string, one of `target_languages` per text), and the
    graph puts that language's tag before each text, as the training data had it. The
    tag's pieces count towards `max_input_tokens`. A language the model does not know
    fails the call (InvalidArgumentError naming it and the accepted ones).

    Signatures: `serving_default(text, target_language)`,
    `translate_with_options(text, target_language, beam_size, alpha, extra_length)`,
    `translate_per_example(text, target_language, beam_size, alpha, extra_length,
    max_input_tokens)`, `translate_sampled(text, target_language, sampling_topk,
    sampling_temperature, sampling_topp, extra_length, seed)`, `translate_nbest(text,
    target_language, beam_size, alpha, extra_length, max_input_tokens, num_hypotheses,
    no_repeat_ngram_size, repetition_penalty, target_prefix, constraints)`,
    `score(text, target_language, target)` (the tag goes before `text`, the source);
    outputs as :class:`Translator`'s.

    Example:
    >>> translator = MultilingualTranslator(model, spm_bytes, ("de", "fr"))
    >>> translator(tf.constant(["A dog runs."] * 2), tf.constant(["de", "fr"]))
    """

    def __init__(self, model, sentencepiece_model: bytes, target_languages, **options):
        super().__init__(model, sentencepiece_model, **options)
        self.target_languages = multilingual.parse_languages(target_languages)
        self.codec = TextCodec(sentencepiece_model, self.reverse_target,
                               self.target_languages, self.reading, self.codec.markup)

    @signature(TEXT_SPEC, LANGUAGE_SPEC)
    def __call__(self, text, target_language):
        return self.translate(text, target_language=target_language)

    @signature(TEXT_SPEC, LANGUAGE_SPEC, *OPTION_SPECS)
    def translate_with_options(self, text, target_language, beam_size, alpha, extra_length):
        return self.translate(text, beam_size, alpha, extra_length,
                              target_language=target_language)

    @signature(TEXT_SPEC, LANGUAGE_SPEC, *EXAMPLE_OPTION_SPECS)
    def translate_per_example(self, text, target_language, beam_size, alpha, extra_length,
                              max_input_tokens):
        return self.translate(text, beam_size, alpha, extra_length, max_input_tokens,
                              target_language=target_language)

    @signature(TEXT_SPEC, LANGUAGE_SPEC, *SAMPLING_SPECS)
    def translate_sampled(self, text, target_language, sampling_topk, sampling_temperature,
                          sampling_topp, extra_length, seed):
        return self.translate(text, extra_length=extra_length, target_language=target_language,
                              sampling=dict(sampling_topk=sampling_topk,
                                            sampling_temperature=sampling_temperature,
                                            sampling_topp=sampling_topp, seed=seed))

    @signature(TEXT_SPEC, LANGUAGE_SPEC, *NBEST_SPECS)
    def translate_nbest(self, text, target_language, beam_size, alpha, extra_length,
                        max_input_tokens, num_hypotheses, no_repeat_ngram_size,
                        repetition_penalty, target_prefix, constraints):
        return self.nbest(text, beam_size, alpha, extra_length, max_input_tokens,
                          num_hypotheses, no_repeat_ngram_size, repetition_penalty,
                          target_prefix, constraints, target_language=target_language)

    @signature(TEXT_SPEC, LANGUAGE_SPEC, TARGET_SPEC)
    def score(self, text, target_language, target):
        return self.score_pairs(text, target, target_language)
