"""The systems TxSync is measured beside, started from their Debian packages on loopback,
their peer-to-peer traffic through the same link emulator as TxSync's coordinators."""
