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
         [fetches=N]                                  (pending_fetches_max)
         [counter=N synced=t1@1/a,... incoming=t2@2/b+,t3@3/c-]   (+ acquired, - not)
    local a t1
    post a from=b [seq=1] [epoch=1] [view=0] base=0 counter=3 queue=t1@1/a,t2@2/b
    entries a from=b start=0 queue=t1@1/a
    body a t1
    tick a 500
    change a                                          (an operator asks for a view change)
    membership a position=7 node=d weight=1           (a membership entry synced at 7)
    truncated a 3                                     (the store's history starts after 3)
    prepare a from=b ballot=1.1.b                     (view_no.attempt.proposer)
    promise a from=b ballot=1.1.a base=0 counter=3 [queue=...] [accepted=1.1.c view=1:a,b
          seal_start=0 seal=t1@1/a]
    accept a from=b ballot=1.1.b view=1:a,b [seal_start=0] [seal=...]
    accepted a from=b ballot=1.1.a
    install a from=b view=1:a,b [seal_start=0] [seal=...]
    refused a from=b ballot=1.1.a view=0 [promised=1.2.c]
    query a from=b view=0

``node`` also takes ``view=1:a,b`` (an installed view, seal empty at genesis); views take
``config=a,b,c=2`` (weights; default: the members, weight 1) and ``applied=N``.

Creating a node steps it once with ``Tick(now)``. Set ``TXSYNC_REWRITE=1`` to rewrite
the expected blocks from what the core does now (then review the diff by eye).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from txsync.protocol import (
    Ballot,
    BodyAcquired,
    ConfigChange,
    ConfigChangeSynced,
    Configuration,
    DurableState,
    Event,
    FetchBody,
    HistoryTruncated,
    Limits,
    LocalTx,
    MergeBase,
    PersistCounter,
    PersistDropIncoming,
    PersistIncoming,
    PersistSynced,
    PersistView,
    PersistViewVote,
    Post,
    PostReceived,
    ProtocolNode,
    PushBody,
    Ready,
    SendPost,
    SendSyncedEntries,
    SendViewMessage,
    ServeCatchUpFromLog,
    SyncedEntries,
    SyncedEntriesReceived,
    Tick,
    TxMeta,
    View,
    ViewAccept,
    ViewAccepted,
    ViewChangeRequested,
    ViewInstall,
    ViewMessage,
    ViewMessageReceived,
    ViewPrepare,
    ViewPromise,
    ViewProposal,
    ViewQuery,
    ViewRefused,
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


def _ballot(text: str | None) -> Ballot | None:
    if not text or text == "-":
        return None
    view_no, attempt, proposer = text.split(".")
    return Ballot(int(view_no), int(attempt), proposer)


def _proposal(kv: dict[str, str]) -> ViewProposal:
    """``view=1:a,b`` [``config=a,b,c`` (weight 1 each, or ``a=2``)] [``applied=N``]:
    the configuration defaults to the members."""
    view_no, members = kv["view"].split(":")
    view = View(int(view_no), tuple(members.split(",")))
    weights: dict[str, int] = {}
    for item in kv.get("config", members).split(","):
        node, _, weight = item.partition("=")
        weights[node] = int(weight or "1")
    configuration = Configuration.of(weights, int(kv.get("applied", "0")))
    seal = _metas(kv.get("seal", ""))
    return ViewProposal(view, _base(kv.get("seal_start", "0")), seal, configuration)


def show_ballot(ballot: Ballot | None) -> str:
    return "-" if ballot is None else f"{ballot.view_no}.{ballot.attempt}.{ballot.proposer}"


def show_proposal(proposal: ViewProposal | None) -> str:
    if proposal is None:
        return "-"
    view = proposal.view
    shown = f"view={view.view_no}:{','.join(view.members)} "
    shown += f"seal={show_base(proposal.seal_start)}+{show_metas(proposal.seal)}"
    configuration = proposal.configuration
    if configuration.weights != tuple((member, 1) for member in view.members):
        weights = (n if w == 1 else f"{n}={w}" for n, w in configuration.weights)
        shown += " config=" + ",".join(weights)
    if configuration.applied_position:
        shown += f" applied={configuration.applied_position}"
    return shown


def show_view_message(message: ViewMessage) -> str:
    match message:
        case ViewPrepare(_, ballot):
            return f"prepare {show_ballot(ballot)}"
        case ViewPromise(_, ballot, base, counter, queue, accepted_ballot, accepted):
            return (
                f"promise {show_ballot(ballot)} base={show_base(base)} counter={counter} "
                f"{show_metas(queue)} accepted={show_ballot(accepted_ballot)} "
                f"{show_proposal(accepted)}"
            )
        case ViewAccept(_, ballot, proposal):
            return f"accept {show_ballot(ballot)} {show_proposal(proposal)}"
        case ViewAccepted(_, ballot):
            return f"accepted {show_ballot(ballot)}"
        case ViewInstall(_, proposal, history_len):
            history = f" history={history_len}" if history_len else ""
            return f"install {show_proposal(proposal)}{history}"
        case ViewRefused(_, ballot, view_no, promised):
            return f"refused {show_ballot(ballot)} view={view_no} promised={show_ballot(promised)}"
        case ViewQuery(_, view_no):
            return f"query view={view_no}"


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
            case PersistDropIncoming(tx_ids):
                out.append(f"persist drop {','.join(tx_ids)}")
            case PersistViewVote(promised, accepted_ballot, accepted):
                out.append(
                    f"persist vote promised={show_ballot(promised)} "
                    f"accepted={show_ballot(accepted_ballot)} {show_proposal(accepted)}"
                )
            case PersistView(installed):
                out.append(f"persist view {show_proposal(installed)}")
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
            case SendViewMessage(to, message):
                out.append(f"send {to} {show_view_message(message)}")
    for b in ready.bodies:
        match b:
            case PushBody(tx_id, peers):
                out.append(f"push {tx_id} -> {','.join(peers)}")
            case FetchBody(tx_id, source):
                out.append(f"fetch {tx_id} <- {source}")
    out.extend(f"reject {r.what}: {r.reason}" for r in ready.rejections)
    out.append(f"next-tick {ready.next_tick_ms}")
    return out


VIEW_VERBS = ("prepare", "promise", "accept", "accepted", "install", "refused", "query")


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
        elif verb == "change":
            event = ViewChangeRequested()
        elif verb == "truncated":
            event = HistoryTruncated(int(rest[0]))
        elif verb == "membership":
            after = int(kv["after"]) if "after" in kv else None
            change = ConfigChange(kv["node"], int(kv["weight"]), after_position=after)
            event = ConfigChangeSynced(int(kv["position"]), change)
        elif verb in VIEW_VERBS:
            event = ViewMessageReceived(self._view_message(verb, kv))
        else:
            raise ValueError(f"unknown command {verb!r}")
        return render_ready(node.step(event))

    @staticmethod
    def _view_message(verb: str, kv: dict[str, str]) -> ViewMessage:
        sender = kv["from"]
        ballot = _ballot(kv.get("ballot"))
        if verb == "prepare":
            assert ballot is not None
            return ViewPrepare(sender, ballot)
        if verb == "promise":
            assert ballot is not None
            accepted_ballot = _ballot(kv.get("accepted"))
            return ViewPromise(
                sender,
                ballot,
                _base(kv["base"]),
                int(kv["counter"]),
                _metas(kv.get("queue", "")),
                accepted_ballot,
                _proposal(kv) if accepted_ballot is not None else None,
            )
        if verb == "accept":
            assert ballot is not None
            return ViewAccept(sender, ballot, _proposal(kv))
        if verb == "accepted":
            assert ballot is not None
            return ViewAccepted(sender, ballot)
        if verb == "install":
            return ViewInstall(sender, _proposal(kv), int(kv.get("history", "0")))
        if verb == "refused":
            assert ballot is not None
            return ViewRefused(sender, ballot, int(kv["view"]), _ballot(kv.get("promised")))
        return ViewQuery(sender, int(kv["view"]))

    def _create(self, name: str, kv: dict[str, str]) -> list[str]:
        now = int(kv.get("now", "0"))
        limits = Limits(
            post_txs_max=int(kv.get("post_txs_max", "4096")),
            catchup_entries_max=int(kv.get("catchup_entries_max", "1024")),
            synced_window_max=int(kv.get("window", "100000")),
            pending_fetches_max=int(kv.get("fetches", "65536")),
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
            view=_proposal(kv) if "view" in kv else None,
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
