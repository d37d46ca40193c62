"""The one-line records a job's processes write to standard output: ``NCCLRL|rank|kind|payload``."""

from __future__ import annotations

import json
from dataclasses import dataclass

MARK = "NCCLRL|"

@dataclass
class Record:
    """One line a worker wrote: ``NCCLRL|rank|kind|payload``."""

    rank: int
    kind: str
    payload: str


def parse_records(line: str) -> tuple[list[Record], str]:
    """The records in a line of a launcher's output, and the rest of the line. Launchers may prefix
    lines (``[1,0]<stdout>:``, ``[rank0]:``) and, forwarding many ranks, glue one rank's line onto
    another's or into NCCL's own output: every record is found wherever it starts."""
    parts = line.rstrip("\n").split(MARK)
    out, rest = [], parts[0]
    for part in parts[1:]:
        fields = part.split("|", 2)
        if len(fields) == 3 and fields[0].lstrip("-").isdigit():
            out.append(Record(int(fields[0]), fields[1], fields[2]))
        else:
            rest += MARK + part
    return out, rest


def parse_record(line: str) -> Record | None:
    """The first record in a line, or ``None``."""
    recs, _ = parse_records(line)
    return recs[0] if recs else None


def payload_json(payload: str):
    """A record's JSON payload; text glued after it (another rank's output) is ignored."""
    return json.JSONDecoder().raw_decode(payload.strip())[0]

