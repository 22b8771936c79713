"""Data-driven protocol tests: a script of events and the exact effects each must produce.

A script is a series of blocks::

    # comments start with '#'
    <command>
    ----
    <expected effects, one per line>
    <blank line>

Commands (tx and node names are short words; ``t1@3/a`` is tx t1 with ts 3 from node a;
``base=2/t5`` is a merge base of length 2 ending in t5, ``base=0`` the genesis):

    node a members=a,b,c [now=0] [post_txs_max=N] [catchup_entries_max=N] [window=N]
         [counter=N synced=t1@1/a,... incoming=t2@2/b+,t3@3/c-]   (+ acquired, - not)
    local a t1
    post a from=b [seq=1] [epoch=1] [view=0] base=0 counter=3 queue=t1@1/a,t2@2/b
    entries a from=b start=0 queue=t1@1/a
    body a t1
    tick a 500

Creating a node steps it once with ``Tick(now)``. Set ``TXSYNC_REWRITE=1`` to rewrite
the expected blocks from what the core does now (then review the diff by eye).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from txsync.protocol import (
    BodyAcquired,
    DurableState,
    Event,
    FetchBody,
    Limits,
    LocalTx,
    MergeBase,
    PersistCounter,
    PersistIncoming,
    PersistSynced,
    Post,
    PostReceived,
    ProtocolNode,
    PushBody,
    Ready,
    SendPost,
    SendSyncedEntries,
    ServeCatchUpFromLog,
    SyncedEntries,
    SyncedEntriesReceived,
    Tick,
    TxMeta,
)


@dataclass
class Block:
    command: str
    expected: list[str]
    line_no: int
    comments: list[str]


def parse_script(text: str) -> list[Block]:
    blocks: list[Block] = []
    lines = text.splitlines()
    index = 0
    comments: list[str] = []
    while index < len(lines):
        line = lines[index].strip()
        if not line or line.startswith("#"):
            if line:
                comments.append(line)
            index += 1
            continue
        command, command_line = line, index + 1
        index += 1
        if index >= len(lines) or lines[index].strip() != "----":
            raise ValueError(f"line {command_line}: expected '----' after {command!r}")
        index += 1
        expected: list[str] = []
        while index < len(lines) and lines[index].strip():
            expected.append(lines[index].rstrip())
            index += 1
        blocks.append(Block(command, expected, command_line, comments))
        comments = []
    return blocks


def render_script(blocks: list[Block]) -> str:
    parts = []
    for block in blocks:
        parts.append("\n".join([*block.comments, block.command, "----", *block.expected]) + "\n")
    return "\n".join(parts)


def _meta(text: str) -> TxMeta:
    name, _, rest = text.partition("@")
    ts, _, origin = rest.partition("/")
    return TxMeta(int(ts), name, origin)


def _metas(text: str) -> tuple[TxMeta, ...]:
    return tuple(_meta(item) for item in text.split(",") if item)


def _base(text: str) -> MergeBase:
    if text == "0":
        return MergeBase.genesis()
    length, _, last = text.partition("/")
    return MergeBase(int(length), last)


def show_meta(meta: TxMeta) -> str:
    return f"{meta.tx_id}@{meta.ts}/{meta.origin}"


def show_metas(metas: tuple[TxMeta, ...]) -> str:
    return "[" + " ".join(show_meta(m) for m in metas) + "]"


def show_base(base: MergeBase) -> str:
    return "0" if base.synced_len == 0 else f"{base.synced_len}/{base.last_tx_id}"


def render_ready(ready: Ready) -> list[str]:
    out: list[str] = []
    for p in ready.persist:
        match p:
            case PersistCounter(counter):
                out.append(f"persist counter={counter}")
            case PersistIncoming(metas):
                out.append(f"persist incoming {show_metas(metas)}")
            case PersistSynced(start, metas):
                out.append(f"persist synced at {show_base(start)} {show_metas(metas)}")
    out.extend(f"state {c.tx_id} {c.state.name}" for c in ready.state_changes)
    for m in ready.messages:
        match m:
            case SendPost(to, post):
                out.append(
                    f"send {to} post e{post.epoch} s{post.seq} base={show_base(post.base)} "
                    f"counter={post.counter} {show_metas(post.queue)}"
                )
            case SendSyncedEntries(to, entries):
                out.append(
                    f"send {to} entries start={show_base(entries.start)} "
                    f"{show_metas(entries.entries)}"
                )
            case ServeCatchUpFromLog(to, from_len, count_max):
                out.append(f"serve-from-log {to} from={from_len} count={count_max}")
    for b in ready.bodies:
        match b:
            case PushBody(tx_id, peers):
                out.append(f"push {tx_id} -> {','.join(peers)}")
            case FetchBody(tx_id, source):
                out.append(f"fetch {tx_id} <- {source}")
    out.extend(f"reject {r.what}: {r.reason}" for r in ready.rejections)
    out.append(f"next-tick {ready.next_tick_ms}")
    return out


class ScriptRun:
    def __init__(self) -> None:
        self.nodes: dict[str, ProtocolNode] = {}
        self.now: dict[str, int] = {}

    def execute(self, command: str) -> list[str]:
        words = command.split()
        verb, name, rest = words[0], words[1], words[2:]
        kv = dict(word.split("=", 1) for word in rest if "=" in word)
        if verb == "node":
            return self._create(name, kv)
        node = self.nodes[name]
        event: Event
        if verb == "local":
            event = LocalTx(rest[0])
        elif verb == "post":
            event = PostReceived(
                Post(
                    view_no=int(kv.get("view", "0")),
                    sender=kv["from"],
                    epoch=int(kv.get("epoch", "1")),
                    seq=int(kv.get("seq", "1")),
                    base=_base(kv["base"]),
                    counter=int(kv["counter"]),
                    queue=_metas(kv.get("queue", "")),
                )
            )
        elif verb == "entries":
            event = SyncedEntriesReceived(
                SyncedEntries(
                    int(kv.get("view", "0")), kv["from"], _base(kv["start"]), _metas(kv["queue"])
                )
            )
        elif verb == "body":
            event = BodyAcquired(rest[0])
        elif verb == "tick":
            self.now[name] = int(rest[0])
            event = Tick(self.now[name])
        else:
            raise ValueError(f"unknown command {verb!r}")
        return render_ready(node.step(event))

    def _create(self, name: str, kv: dict[str, str]) -> list[str]:
        now = int(kv.get("now", "0"))
        limits = Limits(
            post_txs_max=int(kv.get("post_txs_max", "4096")),
            catchup_entries_max=int(kv.get("catchup_entries_max", "1024")),
            synced_window_max=int(kv.get("window", "100000")),
        )
        synced = _metas(kv.get("synced", ""))
        incoming = tuple(
            (_meta(item[:-1]), item.endswith("+"))
            for item in kv.get("incoming", "").split(",")
            if item
        )
        durable = DurableState(
            counter=int(kv.get("counter", "0")),
            epoch=int(kv.get("epoch", "1")),
            synced_len=len(synced),
            synced_tail=synced,
            incoming=incoming,
        )
        node = ProtocolNode(
            name, kv["members"].split(","), now_ms=now, durable=durable, limits=limits
        )
        self.nodes[name] = node
        self.now[name] = now
        return render_ready(node.step(Tick(now)))


def run_script_file(path: Path) -> tuple[list[Block], list[Block]]:
    """Returns (expected blocks, actual blocks); rewrites the file if TXSYNC_REWRITE=1."""
    text = path.read_text()
    blocks = parse_script(text)
    run = ScriptRun()
    actual = [Block(b.command, run.execute(b.command), b.line_no, b.comments) for b in blocks]
    if os.environ.get("TXSYNC_REWRITE") == "1":
        path.write_text(render_script(actual))
    return blocks, actual
