# embed_page.cmake: numesh_embed_web_page(PAGE TEMPLATE OUTPUT), the page for people that
# `numesh serve` answers GET / with, put into the binary at configure time (no build step, no
# file to install beside the program). It reads PAGE (serve/web/index.html), checks that it can
# sit in a C++ raw string literal, computes the Content-Security-Policy that lets its own inline
# <script> and <style> run and nothing else (their SHA-256 hashes, as CSP wants them: base64 of
# the digest), and writes OUTPUT from TEMPLATE (web_page.cpp.in: web_page() and
# web_page_policy(), declared in serve/src/web_page.hpp). An edit of PAGE reconfigures
# (CMAKE_CONFIGURE_DEPENDS); OUTPUT is rewritten only when it changes.

# The base64 of the bytes whose hexadecimal digits are HEX (an even count).
function(_numesh_base64_of_hex hex out)
  set(alphabet "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")
  string(LENGTH "${hex}" digits)
  set(encoded "")
  set(at 0)
  while(at LESS digits)
    # Three bytes (six digits) make four characters; a last group of one or two bytes is
    # padded with zero bits and its missing characters written as "=".
    string(SUBSTRING "${hex}" ${at} 6 group)
    string(LENGTH "${group}" group_digits)
    math(EXPR bytes "${group_digits} / 2")
    while(group_digits LESS 6)
      string(APPEND group "0")
      math(EXPR group_digits "${group_digits} + 1")
    endwhile()
    math(EXPR value "0x${group}")
    math(EXPR characters "${bytes} + 1")
    foreach(shift 18 12 6 0)
      if(characters GREATER 0)
        math(EXPR index "(${value} >> ${shift}) & 63")
        string(SUBSTRING "${alphabet}" ${index} 1 character)
        string(APPEND encoded "${character}")
        math(EXPR characters "${characters} - 1")
      else()
        string(APPEND encoded "=")
      endif()
    endforeach()
    math(EXPR at "${at} + 6")
  endwhile()
  set(${out} "${encoded}" PARENT_SCOPE)
endfunction()

# CSP's source expression for the one inline element TAG (script or style) of HTML:
# 'sha256-BASE64' of the text between <TAG> and </TAG>, byte for byte as the browser hashes it.
function(_numesh_inline_hash html tag page out)
  string(FIND "${html}" "<${tag}>" open)
  string(FIND "${html}" "<${tag}>" last_open REVERSE)
  string(FIND "${html}" "</${tag}>" close)
  if(open EQUAL -1 OR close EQUAL -1 OR NOT open EQUAL last_open)
    message(FATAL_ERROR "${page}: the page must hold exactly one <${tag}> (written so, without "
                        "attributes) and its </${tag}>: the Content-Security-Policy allows that "
                        "one by its hash")
  endif()
  string(LENGTH "<${tag}>" skip)
  math(EXPR begin "${open} + ${skip}")
  math(EXPR length "${close} - ${begin}")
  string(SUBSTRING "${html}" ${begin} ${length} text)
  string(SHA256 digest "${text}")
  _numesh_base64_of_hex("${digest}" encoded)
  set(${out} "'sha256-${encoded}'" PARENT_SCOPE)
endfunction()

function(numesh_embed_web_page page template output)
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${page}")
  file(READ "${page}" html)
  # The page goes into R"numesh_page(...)numesh_page": it must not hold the closing delimiter.
  set(delimiter "numesh_page")
  string(FIND "${html}" ")${delimiter}\"" clash)
  if(NOT clash EQUAL -1)
    message(FATAL_ERROR "${page} holds `)${delimiter}\"`, which would end the raw string literal "
                        "it is embedded in (${template}): change one of them")
  endif()
  # The browser hashes an inline script after the HTML parser has turned CR LF and CR into LF.
  # file(READ) drops the CR of CR LF likewise; a CR alone would make the hash differ.
  string(FIND "${html}" "\r" carriage_return)
  if(NOT carriage_return EQUAL -1)
    message(FATAL_ERROR "${page} has a CR that does not end a line in CR LF: save it with LF "
                        "line ends only")
  endif()
  _numesh_inline_hash("${html}" script "${page}" script_hash)
  _numesh_inline_hash("${html}" style "${page}" style_hash)
  file(RELATIVE_PATH NUMESH_WEB_PAGE_SOURCE "${PROJECT_SOURCE_DIR}" "${page}")
  set(NUMESH_WEB_PAGE_DELIMITER "${delimiter}")
  set(NUMESH_WEB_PAGE "${html}")
  # Same origin only (connect-src, img-src and the rest fall back to default-src), the page's own
  # script and style only (no inline handler or style attribute), no <base>, no form posted
  # anywhere, not framed.
  string(CONCAT NUMESH_WEB_PAGE_POLICY "default-src 'self'; script-src ${script_hash}; "
                "style-src ${style_hash}; base-uri 'none'; form-action 'none'; "
                "frame-ancestors 'none'")
  configure_file("${template}" "${output}" @ONLY)
endfunction()
