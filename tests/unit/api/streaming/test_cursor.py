import pytest

from api.streaming.cursor import OPENING, BadCursor, Cursor


def test_entry_ids_and_usage_suffix_parse():
    assert Cursor.parse("1795324333123-7") == Cursor("1795324333123-7", False)
    assert Cursor.parse("1795324333123-7/usage") == Cursor("1795324333123-7", True)
    assert Cursor.parse(OPENING).after_opening


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "abc",
        "1-",
        "-1",
        "1-2/usage/x",
        "1-2\n",
        "1 2",
        "99999999999999999999999-1",
        # 20 digits pass a length check but not Redis: one such cursor used to make the shared
        # XREAD of every stream of a replica fail (the security review)
        "18446744073709551616-0",
        "1-18446744073709551616",
        "99999999999999999999-99999999999999999999",
    ],
)
def test_anything_else_is_refused(bad):
    with pytest.raises(BadCursor):
        Cursor.parse(bad)


def test_the_largest_stream_ids_redis_accepts_parse():
    top = 2**64 - 1
    assert Cursor.parse(f"{top}-{top}").entry_id == f"{top}-{top}"
