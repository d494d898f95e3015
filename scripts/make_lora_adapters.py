"""Make the test LoRA adapters for the default model; see kronk_testing.models.lora."""

from kronk_testing.models import lora
from kronk_testing.models.output import main_all

if __name__ == "__main__":
    main_all(lora.__doc__, lora.MAKERS)
