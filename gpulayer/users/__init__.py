"""Users the cluster knows: tokens (``token.py``), the signed user table in Redis (``table.py``).

A user holds a token (a name, an Ed25519 seed, the cluster's public key); every message it sends is signed
with that seed (``signing.py``, format ``GL2``) and every worker checks the signature against the user's
entry in ``gl:users``, an entry the admin command MAC'd with the cluster secret. The threat model is in
docs/SECURITY.md.
"""
