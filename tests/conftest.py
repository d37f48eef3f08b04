"""Shared fixtures of every test folder (tests/README.md says what goes where).

pytest puts this folder on ``sys.path`` when it loads this file, so the shared helper modules
beside it (``concurrency_models``, ``crm_layout``) import by their plain names from any folder.
"""
