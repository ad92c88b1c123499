# The verification script of seed 001 (Pathways elastic training), unchanged: it prints a line
# whenever elastic_manager.good_slice_count changes between two step lines of a log.
  /step=/ && /elastic_manager\.elastic_down_event_count=/ {
    split($0, fields, " ")
    step = ""
    good_slice_count = ""
    for (i in fields) {
      split(fields[i], kv, "=")
      if (kv[1] == "step") {
        step = kv[2]
      } else if (kv[1] == "elastic_manager.good_slice_count") {
        good_slice_count = kv[2]
      }
    }
    if (prev_good_slice_count != "" && prev_good_slice_count != good_slice_count) {
      print "Step: " step ", Old Slice Count: " prev_good_slice_count ", New Slice Count: " good_slice_count
    }
    prev_step = step
    prev_good_slice_count = good_slice_count
  }
