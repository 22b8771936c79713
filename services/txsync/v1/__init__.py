"""Generated from proto/txsync/v1 by scripts/gen_proto.py. Do not edit."""
