"""The SSE decoder and OpenAI chunk reader on hand-written streams: events split at every
position, CR LF split between reads, comments, multi-line data, usage chunk, [DONE], errors."""

import json

import pytest

from draftwise.bench.serving.sse import Chunk, SSEDecoder, StreamError, read_chunk


def completion(text, finish=None):
    return json.dumps({"id": "c", "object": "text_completion", "choices": [{"index": 0, "text": text,
                                                                             "finish_reason": finish}]})


USAGE = json.dumps({"id": "c", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}})
STREAM = (f"data: {completion('Hel')}\n\n: keep-alive\n\ndata: {completion('lo')}\r\n\r\n"
          f"data: {completion(' there', 'length')}\n\ndata: {USAGE}\n\ndata: [DONE]\n\n")


def decode(pieces):
    decoder = SSEDecoder()
    return [event for piece in pieces for event in decoder.feed(piece)]


def test_whole_stream_gives_every_event_in_order():
    events = decode([STREAM])
    assert [read_chunk(e) for e in events] == [
        Chunk("Hel", None, None), Chunk("lo", None, None), Chunk(" there", "length", None), Chunk("", None, 3), None]


@pytest.mark.parametrize("cut", range(1, len(STREAM)))
def test_a_read_may_stop_anywhere(cut):
    assert decode([STREAM[:cut], STREAM[cut:]]) == decode([STREAM])


def test_one_character_at_a_time():
    assert decode(list(STREAM)) == decode([STREAM])


def test_cr_lf_split_between_reads_is_one_line_ending():
    # a CR at the end of a read waits: were it taken as a line end, the LF after it would end the event early
    assert decode(["data: a\r", "\ndata: b\r\n\r\n"]) == ["a\nb"]


def test_lone_cr_ends_lines_and_multi_line_data_joins_with_lf():
    assert decode(["data: a\rdata:b\r\rdata: c\n\n"]) == ["a\nb", "c"]


def test_event_without_blank_line_is_not_complete():
    assert decode(["data: [DONE]\n"]) == []


def test_other_fields_and_comments_are_ignored():
    assert decode(["event: message\nid: 7\n: ping\ndata: x\nretry: 10\n\n"]) == ["x"]


def test_chat_delta_content_and_role_only_chunks():
    role = json.dumps({"choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]})
    content = json.dumps({"choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}]})
    assert read_chunk(role) == Chunk("", None, None)
    assert read_chunk(content) == Chunk("Hi", None, None)


def test_usage_beside_the_last_choice():
    body = json.loads(completion("!", "stop"))
    body["usage"] = {"completion_tokens": 12}
    assert read_chunk(json.dumps(body)) == Chunk("!", "stop", 12)


@pytest.mark.parametrize("data", ["not json", "[1, 2]", json.dumps({"error": {"message": "boom", "type": "x"}})])
def test_malformed_or_error_events_raise(data):
    with pytest.raises(StreamError):
        read_chunk(data)
