"""The fixed token ids of the shared SentencePiece vocabulary (§5.1), and its file name.

The vocabulary is trained with these ids (:func:`tfxformer.data.train_tokenizer`), and
every layer, decoder and translator reads them from here::

    PAD_ID = 0   padding, never a real token
    UNK_ID = 1   unknown piece (rare: byte fallback spells unseen characters as bytes)
    BOS_ID = 2   first decoder input
    EOS_ID = 3   end of every source and every target sequence

They are also the ids keras-hub's `compute_sentence_piece_proto` assigns.
"""

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
# Ids below this are the special ones above; real pieces start here.
NUM_SPECIAL_IDS = 4
# The vocabulary's file name wherever one is stored (run dir, export assets, preset dir).
SPM_FILENAME = "spm.model"
