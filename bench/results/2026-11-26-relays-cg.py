import sys, json
from riverbed.engine.record import CT_JSON, encode_record, to_json_text, decode_record
from riverbed.shells.ream_text.delivery import delivery_text
payload = json.dumps({"i": 1, "pad": "x"*80}, separators=(",", ":")).encode()
raw = encode_record(payload, CT_JSON)
n = int(sys.argv[2])
if sys.argv[1] == "old":
    for _ in range(n): to_json_text(decode_record(raw)).encode("utf-8")
elif sys.argv[1] == "new":
    for _ in range(n): delivery_text(raw)
