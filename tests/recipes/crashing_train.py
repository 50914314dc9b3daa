"""recipes.train with a crash injected (CRASH_AT_STEP=k): `ENTRY=tests.recipes.crashing_train launch/local.sh`."""

from recipes.train import main
from tests.faults import crash_once_from_env

if __name__ == "__main__":
    main(callbacks=[crash_once_from_env()])
