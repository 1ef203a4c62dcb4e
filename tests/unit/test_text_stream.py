"""The CLI's streamer: what it prints equals the decoded output, without re-decoding it all."""

import io

from draftwise.runtime.text_stream import TextStream

EOS = 0


def byte_detokenize(calls):
    def detokenize(tokens):
        calls.append(len(tokens))
        return bytes(tokens).decode("utf-8", errors="replace")
    return detokenize


def test_printed_text_equals_the_decoded_output_across_split_characters_and_eos():
    rounds = [[72, 105], [0xC3], [0xA9, 10], [65, 66, 10, 67], [0xE2, 0x82], [0xAC, EOS]]  # "Hi", "é\n", ..., "€"
    calls: list[int] = []
    out = io.StringIO()
    stream = TextStream(byte_detokenize(calls), {EOS}, out)
    for tokens in rounds:
        stream.on_tokens(tokens)
    stream.finish()
    every = [t for r in rounds for t in r if t != EOS]
    assert out.getvalue() == bytes(every).decode("utf-8")
    assert "\ufffd" not in out.getvalue()
    # after a finished line only the tokens since it are decoded again
    assert calls[2] == 5 and max(calls[3:]) == len(every) - 5


def test_finish_writes_a_held_back_incomplete_character():
    out = io.StringIO()
    stream = TextStream(byte_detokenize([]), set(), out)
    stream.on_tokens([65, 0xC3])  # ends inside a two-byte character: held back
    assert out.getvalue() == ""
    stream.finish()
    assert out.getvalue() == "A\ufffd"
