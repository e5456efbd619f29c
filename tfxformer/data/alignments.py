"""Word alignments of training pairs, for guided alignment (Garg et al., 2019).

A Pharaoh line ("0-0 1-2 2-1": source word i, target word j, 0-based, as fast_align,
eflomal and `scripts/align.py` write them) gives the links of one training pair, a word
being a whitespace-separated token of its line. Training reads them as piece links: the
pieces of source word i and of target word j are linked (a word's pieces are the piece
that begins with SentencePiece's "▁" and the ones after it). Each example's
(T, S) link matrix is what :func:`tfxformer.losses.guided_alignment_nll` turns into the
attention one decoder head is trained to give (its rows normalised: a target piece
attends to the source pieces it is linked to).

`symmetrize` combines the alignments of the two directions (a model's own of the pairs,
and a reverse model's of the swapped pairs) by intersection, union or Koehn et al.'s
grow-diag-final(-and), as Moses and fast_align's `atools` do.
"""

from __future__ import annotations

import tensorflow as tf

__all__ = ["HEURISTICS", "WORD_START", "link_matrix", "parse_pharaoh", "piece_words",
           "read_links", "symmetrize", "write_links"]

WORD_START = "▁"  # SentencePiece's marker of a piece that begins a word
HEURISTICS = ("grow-diag-final-and", "grow-diag-final", "intersection", "union")
_NEIGHBOURS = ((-1, 0), (0, -1), (1, 0), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1))


def piece_words(pieces: tf.RaggedTensor) -> tf.RaggedTensor:
    """(N, None) piece strings -> (N, None) int32 the word of each piece: a piece beginning
    with "▁" begins a word, and so does each row's first piece."""
    marked = tf.equal(tf.strings.substr(pieces.flat_values, 0, 1, unit="UTF8_CHAR"),
                      WORD_START)
    first = _row_firsts(pieces)
    total = tf.cumsum(tf.cast(marked | first, tf.int32))  # words so far, over all rows
    before = tf.gather(tf.concat([[0], total], 0), pieces.row_starts())
    words = total - tf.repeat(before, pieces.row_lengths()) - 1
    return pieces.with_flat_values(words)


def _row_firsts(pieces: tf.RaggedTensor) -> tf.Tensor:
    """(P,) bool: the flat pieces that begin their row."""
    position = tf.range(tf.size(pieces.flat_values, out_type=tf.int64))
    return tf.equal(position, tf.repeat(pieces.row_starts(), pieces.row_lengths()))


def parse_pharaoh(lines) -> tf.RaggedTensor:
    """(N,) Pharaoh strings -> (N, None, 2) int32 (i, j) links; a link that is not two
    non-negative integers joined by "-" is an InvalidArgumentError naming it."""
    links = tf.strings.split(tf.strings.strip(lines))
    ok = tf.strings.regex_full_match(links.flat_values, r"[0-9]+-[0-9]+")
    check = tf.debugging.Assert(tf.reduce_all(ok), [
        "A word alignment link is not `i-j`:", tf.boolean_mask(links.flat_values, ~ok)],
        summarize=3)
    with tf.control_dependencies([check]):
        parts = tf.strings.split(links.flat_values, "-").to_tensor(shape=[None, 2])
        pairs = tf.strings.to_number(parts, tf.int32)
    return links.with_flat_values(pairs)


def link_matrix(source_words, target_words, links):
    """One example's (T, S) float32 piece links: `source_words` (S,) and `target_words`
    (T,) int32 each piece's word (-1: a piece of no word, e.g. EOS), `links` (P, 2) int32
    its word links (i, j). A link naming a word past either side's last is dropped (a
    Pharaoh line of another tokenization gives fewer links, not an error)."""
    source_count = tf.reduce_max(source_words) + 1
    target_count = tf.reduce_max(target_words) + 1
    i, j = links[:, 0], links[:, 1]
    inside = (i < source_count) & (j < target_count)
    words = tf.scatter_nd(tf.boolean_mask(tf.stack([j, i], axis=1), inside),
                          tf.ones(tf.reduce_sum(tf.cast(inside, tf.int32))),
                          tf.stack([target_count, source_count]))  # (target, source) words
    rows = tf.gather(tf.minimum(words, 1.0), tf.maximum(target_words, 0))
    pieces = tf.gather(rows, tf.maximum(source_words, 0), axis=1)  # (T, S)
    real = (target_words >= 0)[:, None] & (source_words >= 0)[None, :]
    return tf.where(real, pieces, 0.0)


# --- files and symmetrization (Python) --------------------------------------------------

def read_links(line: str) -> set[tuple[int, int]]:
    """One Pharaoh line -> its (i, j) links; ValueError naming a link that is not `i-j`."""
    links = set()
    for link in line.split():
        i, dash, j = link.partition("-")
        if not (dash and i.isdigit() and j.isdigit()):
            raise ValueError(f"A word alignment link {link!r} is not `i-j` (0-based word "
                             "indices).")
        links.add((int(i), int(j)))
    return links


def write_links(links) -> str:
    """(i, j) links -> one Pharaoh line, sorted by i then j."""
    return " ".join(f"{i}-{j}" for i, j in sorted(links))


def symmetrize(forward: set, backward: set, heuristic: str = "grow-diag-final-and") -> set:
    """The links of a pair from both directions' alignments: `forward` (i, j) of the
    source-to-target model, `backward` (i, j) of the target-to-source model (already
    turned to source i, target j). `heuristic`: "intersection", "union", or Koehn et
    al.'s (2005) "grow-diag-final" and "grow-diag-final-and": from the intersection, add
    union links next to (or diagonal to) a link whose either word is still unaligned, then
    ("final") union links of a still unaligned word (with "-and": both unaligned)."""
    if heuristic not in HEURISTICS:
        raise ValueError(f"Unknown symmetrization {heuristic!r}; accepted: {HEURISTICS}.")
    union, links = forward | backward, forward & backward
    if heuristic in ("intersection", "union"):
        return set(union if heuristic == "union" else links)
    source_aligned = {i for i, _ in links}
    target_aligned = {j for _, j in links}

    def add(i, j):
        links.add((i, j))
        source_aligned.add(i)
        target_aligned.add(j)

    grown = True
    while grown:
        grown = False
        for i, j in sorted(links):
            for di, dj in _NEIGHBOURS:
                link = (i + di, j + dj)
                if link in union and link not in links and (
                        link[0] not in source_aligned or link[1] not in target_aligned):
                    add(*link)
                    grown = True
    both = heuristic.endswith("-and")
    for direction in (forward, backward):
        for i, j in sorted(direction):
            free_i, free_j = i not in source_aligned, j not in target_aligned
            if (free_i and free_j) if both else (free_i or free_j):
                add(i, j)
    return links
