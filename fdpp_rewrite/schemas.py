"""The schema string of each file format the package writes and reads, one constant each. The number after the
slash changes when a format changes so that an older reader would misread it; readers refuse other values."""

CONTRACT_SCHEMA = "fdpp-op-contract/1"     # plugins/<Op>Plugin/contract.json
PROFILE_SCHEMA = "fdpp-profile/2"          # engines/profiles/<gpu>.json (`fdpp profile`; engines/profiles/README.md);
#                                            2: each entry stores its silu_mul plan
CALIBRATION_SCHEMA = "fdpp-calibration/1"  # `fdpp calibrate -o`, read by `fdpp rewrite --calibration`
