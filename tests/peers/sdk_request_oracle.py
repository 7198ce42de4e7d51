#!/usr/bin/env python3
"""google-genai's types as a strict reader of a Gemini request body broca rendered (stdin):
each member is validated by the SDK's own model of it (`contents` and `systemInstruction` as
`Content`, `tools` as `Tool`, `generationConfig` as `GenerationConfig`; every one forbids
members it does not know), and a top-level member the API does not take is an error. Prints
one JSON object: {"ok": true, "generation_config": ..., "inline": [...]} as the SDK read it
(snake_case; `inline` each inline part's media type and its bytes, decoded by the SDK, in hex),
or {"ok": false, "error": ...}."""

import json
import sys

from google.genai import types

body = json.load(sys.stdin)
readers = {
    "contents": lambda v: [types.Content.model_validate(c) for c in v],
    "systemInstruction": types.Content.model_validate,
    "tools": lambda v: [types.Tool.model_validate(t) for t in v],
    "generationConfig": types.GenerationConfig.model_validate,
}
try:
    read = {}
    for key, value in body.items():
        if key not in readers:
            raise ValueError(f"the API takes no member {key!r}")
        read[key] = readers[key](value)
    config = read.get("generationConfig")
    inline = [{"mime_type": p.inline_data.mime_type, "hex": p.inline_data.data.hex()}
              for c in read.get("contents", []) for p in (c.parts or []) if p.inline_data]
    print(json.dumps({"ok": True, "generation_config":
                      config.model_dump(exclude_none=True) if config else None,
                      "inline": inline}))
except Exception as e:  # the SDK's own refusal, reported to the test
    print(json.dumps({"ok": False, "error": str(e)}))
