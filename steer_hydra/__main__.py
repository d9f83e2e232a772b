"""`python -m steer_hydra`: run the default job."""

from steer_hydra.main import main

if __name__ == "__main__":
    main()
