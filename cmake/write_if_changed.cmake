# write_if_changed(FILE TEXT): writes TEXT to FILE unless FILE already holds it, so that what
# includes FILE rebuilds only when it changed. Included by the build-time scripts beside it.
function(write_if_changed file text)
  if(EXISTS ${file})
    file(READ ${file} old)
  endif()
  if(NOT "${old}" STREQUAL "${text}")
    file(WRITE ${file} "${text}")
  endif()
endfunction()
