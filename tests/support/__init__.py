"""What tests share: fakes, the scripted engine, config helpers and the tiny policy's fixtures.

No test module imports another test module; what two of them need lives here.
"""
