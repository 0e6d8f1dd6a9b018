"""The unit tier: pure logic and input validation, with no database (a unit test that tries to
connect fails). Run it alone with `make test-unit`."""
