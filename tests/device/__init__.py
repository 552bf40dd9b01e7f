"""The device suite (see conftest.py): a package, so that its conftest does not stand in for the suite's
own `conftest` module, which tests import helpers from."""
