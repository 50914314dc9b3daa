"""recipes.train with every step slowed by STEP_SLEEP_S seconds, so that a test's signal lands mid-run."""

from recipes.train import main
from tests.faults import slow_steps_from_env

if __name__ == "__main__":
    main(callbacks=[slow_steps_from_env()])
