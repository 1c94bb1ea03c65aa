# Writes OUT with the source tree's current git commit, at build time (not configure time), and
# only when it changed, so that results record the commit that was actually built.
execute_process(COMMAND git rev-parse --short HEAD WORKING_DIRECTORY ${SRC}
                OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
execute_process(COMMAND git status --porcelain --untracked-files=no WORKING_DIRECTORY ${SRC}
                OUTPUT_VARIABLE dirty OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT commit)
  set(commit unknown)
elseif(dirty)
  set(commit "${commit}-dirty")
endif()
set(text "#define EXTRAP_GIT_COMMIT \"${commit}\"\n")
include(${CMAKE_CURRENT_LIST_DIR}/write_if_changed.cmake)
write_if_changed(${OUT} "${text}")
