"""How a canary's split picks a version: the conversation key and the weighted hash."""

from __future__ import annotations

from llmgw.router.versions import choose_version, conversation_key


def test_a_session_names_the_conversation_before_its_messages() -> None:
    body = {"messages": [{"role": "user", "content": "hi"}]}
    assert conversation_key(body, "s-1") == "session:s-1"
    assert conversation_key(body, None) != conversation_key(body, "s-1")


def test_later_turns_of_a_conversation_keep_its_key_and_other_conversations_differ() -> None:
    opening = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    later = [*opening, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "?"}]
    other = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "yo"}]
    key = conversation_key({"messages": opening}, None)
    assert key is not None and key.startswith("messages:")
    assert conversation_key({"messages": later}, None) == key
    assert conversation_key({"messages": other}, None) != key


def test_a_completion_prompt_is_keyed_by_its_start_and_an_empty_body_by_nothing() -> None:
    head = "x" * 2000
    assert conversation_key({"prompt": head}, None) == conversation_key(
        {"prompt": head + " more"}, None
    )
    assert conversation_key({}, None) is None
    assert conversation_key({"messages": []}, None) is None


def test_the_split_is_stable_per_key_and_lands_near_the_weights() -> None:
    weights = {"stable": 90, "canary": 10}
    picks = [choose_version(f"conversation {i}", weights) for i in range(10_000)]
    assert picks == [choose_version(f"conversation {i}", weights) for i in range(10_000)]
    share = picks.count("canary") / len(picks)
    assert 0.08 <= share <= 0.12, share
    assert {choose_version(f"k{i}", {"only": 5}) for i in range(50)} == {"only"}
