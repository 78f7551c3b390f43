from worker.attempts.slots import Slots


def test_a_worker_holds_its_slots_and_no_more():
    slots = Slots(2)
    slots.owners = lambda: ["key:a", "key:a"]
    assert slots.reserve(0) and slots.reserve(0)
    assert not slots.reserve(0)  # no guest slot on a chat worker
    slots.release()
    assert slots.reserve(0)


def test_the_guest_slot_opens_while_one_key_holds_every_slot_and_holds_one_job():
    owners = ["key:a", "key:a"]
    slots = Slots(2, guest=True)
    slots.owners = lambda: owners
    assert slots.reserve(0) and slots.reserve(0)
    assert slots.reserve(0)  # the guest slot: for the next job in the queue
    owners.append("key:b")
    assert not slots.reserve(0)  # SLOTS + 1 at most


def test_the_guest_slot_stays_shut_for_two_keys_or_none():
    for held in (["key:a", "key:b"], ["", ""], ["key:a"]):
        slots = Slots(2, guest=True)
        slots.owners = lambda held=held: held
        assert slots.reserve(0) and slots.reserve(0)
        assert not slots.reserve(0), held


def test_the_guest_slot_is_known_as_such_while_it_is_held():
    """TAKE gives the guest slot only another key's job: the loop asks which slot it holds."""
    slots = Slots(2, guest=True)
    slots.owners = lambda: ["key:a", "key:a"]
    assert slots.turns and not Slots(2).turns  # keys take turns on an embedding worker only
    assert slots.reserve(0) and not slots.in_guest()
    assert slots.reserve(0) and not slots.in_guest()
    assert slots.reserve(0) and slots.in_guest()
    slots.release()  # nothing for the guest slot: given back
    assert not slots.in_guest()
