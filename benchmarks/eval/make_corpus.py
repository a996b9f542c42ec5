"""Write the generated part of the development corpus (``benchmarks/eval/generated/``).

Two documents made to be hard for retrieval in ways the samples are not: a
12-page PDF service manual whose pages share most of their vocabulary (pump,
pressure, valve, alarm, controller), so a question must find *the* page, and
Markdown release notes whose sections look alike and differ mostly by their
version heading. The text is fixed (written for this set); the output is
byte-for-byte deterministic, so the files are committed and this script only
reproduces them::

    .venv/bin/python benchmarks/eval/make_corpus.py        # rewrites benchmarks/eval/generated/
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "tests"))

from support.pdfs import make_pdf  # noqa: E402 - the project's own minimal PDF writer

MANUAL = [
    ("1. Safety and scope",
     "This manual covers the HC-40 pump controller in firmware 3.x. Before opening the enclosure, "
     "isolate the mains supply at the wall switch and wait five minutes: the drive capacitors hold a "
     "dangerous charge after the display goes dark. Only the terminal block and the sensor connectors "
     "are user serviceable; the drive board has no replaceable parts. Wear insulated gloves when the "
     "enclosure is open."),
    ("2. Installing the controller",
     "Mount the controller vertically with the cable glands at the bottom so condensation drains away "
     "from the board. Leave 150 mm of free space above the heat sink. The enclosure is rated IP55: it "
     "tolerates water jets but not immersion, so never install it below the flood line of the pump pit. "
     "Use the supplied M6 bolts; the enclosure must not carry the weight of the supply cable."),
    ("3. Wiring the pressure sensor",
     "The pressure transducer connects to terminals S1 (signal) and S2 (ground) and must deliver 4 to 20 "
     "mA. A reading below 3.6 mA is treated as a broken wire and raises alarm A12. Use shielded cable and "
     "ground the shield at the controller end only; grounding both ends creates a loop that shows up as a "
     "slowly wandering pressure reading."),
    ("4. First start-up",
     "On first power-up the controller runs a motor identification routine that takes about 90 seconds. "
     "The pump must be primed and the discharge valve open, because the routine spins the motor at full "
     "speed for part of that time. Do not interrupt it: a cancelled identification leaves the default "
     "motor model in place and the controller will later report overcurrent at high load."),
    ("5. Pressure control loop",
     "The controller keeps discharge pressure at the set point with a PI loop. The proportional band "
     "(parameter P-21) sets how hard it reacts; the integral time (P-22) how fast it removes a steady "
     "offset. If the pressure hunts up and down around the set point, widen the proportional band first "
     "and lengthen the integral time only if hunting continues."),
    ("6. Sleep mode",
     "When demand stops, the pump keeps running at minimum speed for the sleep delay (P-31, default 60 "
     "seconds) and then stops. It wakes when pressure falls below the set point minus the wake "
     "differential (P-32, default 0.3 bar). A leaking non-return valve makes the pump wake every few "
     "minutes with no water drawn; check the valve before raising the differential."),
    ("7. Dry-run protection",
     "If the motor power drops under 30 percent of nominal while running above 80 percent speed, the "
     "controller assumes the pump has lost its water and stops it with alarm A07. It retries after 10 "
     "minutes and gives up after three attempts within an hour, after which a manual reset at the keypad "
     "is required. Disable this protection only for pumps that are never allowed to run empty anyway."),
    ("8. Alarm list",
     "A03 overcurrent: the motor drew more than its rated current for longer than 5 seconds. A05 "
     "overvoltage on the DC bus, usually when a large pump decelerates too quickly; lengthen the ramp "
     "(P-12). A07 dry run, see section 7. A09 heat sink above 85 degrees C. A12 pressure sensor signal "
     "lost. A15 communication timeout on the Modbus link."),
    ("9. Modbus interface",
     "The RS-485 port speaks Modbus RTU at 19200 baud, 8 data bits, even parity and one stop bit by "
     "default. The station address is parameter P-51. Terminate the bus with 120 ohm resistors at both "
     "physical ends only. The actual pressure is readable in holding register 40012, scaled in hundredths "
     "of a bar; writing to register 40020 changes the set point."),
    ("10. Running two pumps",
     "Two controllers linked over their sync cable share the duty: the lead pump runs first and the lag "
     "pump joins when the lead reaches 95 percent speed for 20 seconds. The roles swap every 24 hours of "
     "running time so both pumps wear evenly. If the sync cable breaks, each controller falls back to "
     "running alone on its own sensor."),
    ("11. Maintenance schedule",
     "Every three months, clean the heat sink fins with dry compressed air and check that the fan turns "
     "freely. Once a year, retighten the power terminals to 1.2 Nm and compare the sensor reading with a "
     "calibrated gauge. The cooling fan is rated for 40,000 hours and should be replaced after five years "
     "of continuous service."),
    ("12. Firmware update",
     "Firmware is loaded from a FAT32 USB stick holding a single file named hc40.bin in its root folder. "
     "Hold the MENU key while switching on until the display shows UPD, then release it; the update takes "
     "about two minutes. Parameters are kept, but the alarm history is cleared. Never remove power during "
     "the update: a half-written image needs a service tool to recover."),
]

RELEASES = [
    ("3.4.0", "Adds a second set point selectable from a digital input, for day and night pressure. "
              "The keypad now locks after ten minutes without a key press."),
    ("3.3.2", "Fixes a rare reboot when the Modbus master polled faster than every 20 ms. "
              "The heat sink alarm threshold is read correctly again after a parameter reset."),
    ("3.3.0", "Introduces the pump alternation timer for duty sharing, replacing the fixed swap at "
              "midnight. The dry-run retry count becomes adjustable."),
    ("3.2.1", "Corrects the scaling of the flow estimate for motors above 15 kW. "
              "The display no longer flickers when the backlight timer expires."),
    ("3.2.0", "Adds anti-jam: at start the motor reverses briefly three times to free a blocked impeller. "
              "Sleep mode learns to ignore short pressure dips."),
    ("3.1.0", "First release with Modbus RTU support on the RS-485 port. "
              "Adds the alarm history with timestamps for the last fifty events."),
    ("3.0.1", "Fixes the motor identification routine aborting on pumps with long cables. "
              "Speeds up start-up by skipping the self-test when the enclosure was not opened."),
    ("3.0.0", "New control core with a PI pressure loop replacing the on-off mode of the 2.x series. "
              "Parameters from 2.x are not carried over and must be entered again."),
]


def main(out: Path = HERE / "generated") -> None:
    out.mkdir(parents=True, exist_ok=True)
    pages = []
    for heading, text in MANUAL:
        pages.append(heading + "\n" + "\n".join(textwrap.wrap(text, 90)))
    make_pdf(out / "hc40-service-manual.pdf", pages, title="HC-40 pump controller: service manual")
    notes = ["# HC-40 firmware release notes", ""]
    for version, text in RELEASES:
        notes += [f"## Version {version}", "", text, ""]
    (out / "hc40-release-notes.md").write_text("\n".join(notes), encoding="utf-8")
    print(f"wrote {out}/hc40-service-manual.pdf and {out}/hc40-release-notes.md")


if __name__ == "__main__":
    main()
